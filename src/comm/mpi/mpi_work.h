#pragma once
// How the mpi backend runs one collective: queued on the MPI thread (mpi_runtime.h), waited for by a Work
// handle with the communicator's deadline. MPI cannot cancel a collective, so a deadline that passes leaves
// the communicator unusable, and every later collective is refused at once instead of queueing behind it.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "mpi_api.h"
#include "mpi_runtime.h"
#include "tandem/comm/communicator.h"

namespace tandem::comm {

// A communicator's duplicate of MPI_COMM_WORLD (so the program's own MPI traffic never matches ours) and
// whether a passed deadline has left it unusable. `comm`, `rank` and `size` are touched only on the MPI thread.
struct MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;

  // Why the group is unusable; empty while it is usable.
  std::string broken();
  void set_broken(const std::string& reason);

 private:
  std::mutex mutex_;
  std::string broken_reason_;
};

// Queues `body` on the MPI thread, where it runs on the group's communicator, and returns the Work that waits
// for it until `timeout` has passed. Throws CommError at once where the group is already unusable.
WorkPtr start_on_mpi_thread(const std::shared_ptr<MpiRuntime>& runtime, const std::shared_ptr<MpiGroup>& group,
                            std::chrono::milliseconds timeout, const std::string& operation,
                            std::function<void(MPI_Comm)> body);

}  // namespace tandem::comm
