#pragma once
// The factory that turns a backend name into a Communicator. Backends absent from this build (see
// tandem/config.h) are refused by name, with the reason.
#include <chrono>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

// Backends compiled into this build, e.g. {"gloo", "mpi"}.
std::vector<std::string> available_backends();

// "nccl" where CUDA is usable and the backend was built, else "gloo".
std::string default_backend();

// Connects this rank to the others. Throws UnsupportedError for a backend that this build lacks.
CommunicatorPtr make_communicator(const std::string& backend, const StorePtr& store, const RankLayout& layout,
                                  std::chrono::milliseconds timeout);

}  // namespace tandem::comm
