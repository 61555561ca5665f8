#pragma once
// The error of a backward in which parameters got no gradient without find_unused_parameters. Every rank
// throws it at once, after the tail named the ranks with such parameters (bucket_tail.h): no rank is left
// waiting in a collective.
//
// Private to the reducer.
#include <string>
#include <vector>

namespace tandem::ddp {

// The ranks in `ranks_missing` name their own parameters (`missing`, non-empty on them), the others name those
// ranks.
[[noreturn]] void throw_unused_parameters(int rank, const std::vector<std::string>& missing,
                                          const std::vector<int>& ranks_missing);

}  // namespace tandem::ddp
