#pragma once
// What the reducer checks of its DdpOptions at construction, and how it states them for the ranks' model check
// (replica_sync.h), which then stops every rank alike when their options differ.
//
// Private to the reducer.
#include <string>

#include "tandem/ddp/ddp_options.h"

namespace tandem::ddp {

// Throws InvalidArgument for a cap or a replica check interval out of range.
void check_ddp_options(const DdpOptions& options);
// Every option that must be equal on all ranks, as one line; the options' comm hook must be set.
std::string describe_ddp_options(const DdpOptions& options);

}  // namespace tandem::ddp
