#include "tandem/data/data_agreement.h"

#include <fmt/format.h>

#include <algorithm>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::data {

void verify_ranks_hold_same_data(comm::Communicator& communicator, const Dataset& dataset, const std::string& what) {
  if (communicator.world_size() < 2) return;
  const uint64_t fingerprint = dataset.fingerprint();
  const std::string mine = fingerprint == 0 ? fmt::format("{} samples", dataset.size())
                                            : fmt::format("{} samples (fingerprint {:016x})", dataset.size(), fingerprint);
  const std::vector<std::string> all = comm::all_gather_strings(communicator, mine);
  if (std::all_of(all.begin(), all.end(), [&](const std::string& value) { return value == all.front(); })) return;
  throw InvalidArgument(fmt::format("the ranks' {} differ: {}; every rank must read the same data set (the same "
                                    "files, flags and `dir` contents on every node)",
                                    what, comm::describe_rank_groups(all)));
}

}  // namespace tandem::data
