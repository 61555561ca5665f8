#pragma once
// The fast test tier: N ranks as threads of one process, meeting through one in-memory store and talking over
// real Gloo connections on loopback.
#include <torch/types.h>

#include <chrono>
#include <functional>

#include "tandem/comm/communicator.h"

namespace tandem::testing {

// Runs body(rank, communicator) on world_size threads, each with its own Gloo communicator. The first
// exception any rank throws is rethrown here after every thread has finished; the collective timeout turns a
// rank that never arrives into an exception rather than a hang.
void run_thread_ranks(int world_size, const std::function<void(int rank, comm::Communicator& communicator)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The same over a store the caller makes: `store_of(rank)` is rank's connection to one store that all share (a
// CountingStore over a FileStore, to see what each rank sends).
void run_thread_ranks_on(const std::function<comm::StorePtr(int rank)>& store_of, int world_size,
                         const std::function<void(int rank, comm::Communicator& communicator)>& body,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The same with every rank on a GPU, over gpu_test_backend(world_size) (support/gpu.h). Each thread's current
// CUDA device is its rank's. Call only with a GPU visible. Threads share one autograd engine, which runs the
// backward of each device on one thread: where ranks share a GPU, a collective inside one rank's backward
// (DDP, SyncBatchNorm) would wait for a rank whose backward waits behind it. Such tests use processes
// (run_worker_ranks); these thread ranks are for collectives called outside backward.
void run_gpu_thread_ranks(int world_size,
                          const std::function<void(int rank, comm::Communicator& communicator, torch::Device device)>& body,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace tandem::testing
