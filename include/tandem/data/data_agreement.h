#pragma once
// Before training, ranks check that they read the same data set. A node whose copy lacks one file would
// otherwise draw a different shuffle and a different number of batches: a hang at the end of the epoch, or
// gradients averaged over mismatched steps.
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/data/dataset.h"

namespace tandem::data {

// Collective. Compares every rank's size() and fingerprint() of `dataset`, and throws InvalidArgument on every
// rank alike, naming the ranks that differ, when they do. `what` names the data set in that message
// ("training data").
void verify_ranks_hold_same_data(comm::Communicator& communicator, const Dataset& dataset, const std::string& what);

}  // namespace tandem::data
