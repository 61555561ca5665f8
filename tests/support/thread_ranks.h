#pragma once
// The fast test tier: N ranks as threads of one process, meeting through one in-memory store and talking over
// real Gloo connections on loopback.
#include <chrono>
#include <functional>

#include "tandem/comm/communicator.h"

namespace tandem::testing {

// Runs body(rank, communicator) on world_size threads, each with its own Gloo communicator. The first
// exception any rank throws is rethrown here after every thread has finished; the collective timeout turns a
// rank that never arrives into an exception rather than a hang.
void run_thread_ranks(int world_size, const std::function<void(int rank, comm::Communicator& communicator)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace tandem::testing
