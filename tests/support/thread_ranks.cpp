#include "support/thread_ranks.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <mutex>
#include <thread>

#include "tandem/comm/gloo/gloo_communicator.h"
#include "tandem/util/log.h"

namespace tandem::testing {

void run_thread_ranks(int world_size, const std::function<void(int, comm::Communicator&)>& body,
                      std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::exception_ptr first_failure;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        log::set_identity(rank, world_size);
        comm::GlooCommunicator communicator(store, rank, world_size, timeout);
        body(rank, communicator);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_failure) first_failure = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace tandem::testing
