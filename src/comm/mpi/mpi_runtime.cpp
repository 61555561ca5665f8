#include "mpi_runtime.h"

#include <future>
#include <mutex>

#include "mpi_api.h"
#include "tandem/comm/mpi/mpi_communicator.h"
#include "tandem/util/error.h"

namespace tandem::comm {

std::shared_ptr<MpiRuntime> MpiRuntime::instance() {
  static std::mutex mutex;
  static std::shared_ptr<MpiRuntime> runtime;
  std::lock_guard<std::mutex> lock(mutex);
  if (!runtime) runtime = std::shared_ptr<MpiRuntime>(new MpiRuntime());
  return runtime;
}

MpiRuntime::MpiRuntime() {
  thread_ = std::thread([this] {
    tasks_.run_until_stopped();
    if (initialised_here_ && !stuck_) MPI_Finalize();
  });
  try {
    run_sync([this] { initialise(); });
  } catch (...) {
    tasks_.stop();
    thread_.join();
    throw;
  }
}

MpiRuntime::~MpiRuntime() {
  tasks_.stop();
  // A collective that timed out may never return; joining it would turn the timeout into a hang at exit.
  if (stuck_) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void MpiRuntime::submit(std::function<void()> task) { tasks_.push(std::move(task)); }

void MpiRuntime::run_sync(const std::function<void()>& task) {
  std::packaged_task<void()> packaged(task);
  std::future<void> done = packaged.get_future();
  submit([&packaged] { packaged(); });
  done.get();
}

void MpiRuntime::initialise() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw CommError("MPI was already finalised in this process; the mpi backend cannot start again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // Only this thread calls MPI, and it is the thread that initialised it: FUNNELED would do, SERIALIZED
    // leaves room for the program's own MPI calls between ours.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw CommError("MPI_Init_thread failed; start the program with mpirun (or srun) or check the Open MPI setup");
    }
    initialised_here_ = true;
    if (provided < MPI_THREAD_FUNNELED) {
      throw UnsupportedError("this MPI library provides no thread support; the mpi backend needs MPI_THREAD_FUNNELED");
    }
  } else {
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
      throw UnsupportedError(
          "the program initialised MPI with a thread level below MPI_THREAD_SERIALIZED; the mpi backend calls MPI "
          "from its own thread, so call MPI_Init_thread with MPI_THREAD_SERIALIZED or leave MPI_Init to tandem");
    }
  }
}

void abort_mpi_job(int exit_code) noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // Called from the exiting thread, not the MPI thread, which may be blocked in a collective for good.
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace tandem::comm
