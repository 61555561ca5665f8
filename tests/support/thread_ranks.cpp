#include "support/thread_ranks.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "tandem/comm/backend.h"
#include "support/gpu.h"
#include "tandem/comm/gloo/gloo_communicator.h"
#include "tandem/util/device.h"
#include "tandem/util/log.h"

namespace tandem::testing {

namespace {

// LibTorch 2.x's flight recorder (a per-process ring of the last collectives, for post-mortems) is one singleton whose
// recording of a new process group is not safe against two threads doing it at once: thread ranks are several ranks
// in one process, and they segfaulted there about one run in four (gdb: two ranks inside
// FlightRecorder::recordWithResetEnabled's map insert, both from ProcessGroupGloo::enqueue). A real rank is its own
// process and records from one thread. A buffer of 0 turns the recorder off; it is read when the first process group
// is made, so it is set before main. LibTorch 1.13 has no recorder and ignores it.
const bool flight_recorder_off = [] { return setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/1) == 0; }();

// Runs rank_body(rank) on world_size threads and rethrows the first failure once all have finished.
void on_rank_threads(int world_size, const std::function<void(int rank)>& rank_body) {
  std::mutex mutex;
  std::exception_ptr first_failure;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        log::set_identity(rank, world_size);
        rank_body(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_failure) first_failure = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace

void run_thread_ranks(int world_size, const std::function<void(int, comm::Communicator&)>& body,
                      std::chrono::milliseconds timeout) {
  comm::StorePtr store = c10::make_intrusive<c10d::HashStore>();
  run_thread_ranks_on([&](int) { return store; }, world_size, body, timeout);
}

void run_thread_ranks_on(const std::function<comm::StorePtr(int)>& store_of, int world_size,
                         const std::function<void(int, comm::Communicator&)>& body, std::chrono::milliseconds timeout) {
  on_rank_threads(world_size, [&](int rank) {
    comm::GlooCommunicator communicator(store_of(rank), rank, world_size, timeout);
    body(rank, communicator);
  });
}

void run_gpu_thread_ranks(int world_size, const std::function<void(int, comm::Communicator&, torch::Device)>& body,
                          std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string backend = gpu_test_backend(world_size);
  on_rank_threads(world_size, [&](int rank) {
    comm::RankLayout layout;
    layout.rank = layout.local_rank = rank;
    layout.world_size = layout.local_world_size = world_size;
    const torch::Device device = select_device("cuda", rank);
    make_current(device);
    comm::CommunicatorPtr communicator = comm::make_communicator(backend, store, layout, timeout, device);
    body(rank, *communicator, device);
  });
}

}  // namespace tandem::testing
