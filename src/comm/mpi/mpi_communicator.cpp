#include "tandem/comm/mpi/mpi_communicator.h"

#include <fmt/format.h>
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx, which MPI::MPI_C does not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "tandem/util/error.h"

namespace tandem::comm {

// The one thread of this process that calls MPI. Tasks run in submission order, so collectives issued in the
// same order on every rank match up. Created on first use and kept until exit: MPI cannot be initialised
// twice, so a second communicator reuses it.
class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> instance() {
    static std::mutex mutex;
    static std::shared_ptr<MpiRuntime> runtime;
    std::lock_guard<std::mutex> lock(mutex);
    if (!runtime) runtime = std::shared_ptr<MpiRuntime>(new MpiRuntime());
    return runtime;
  }

  ~MpiRuntime() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    // A collective that timed out may never return; joining it would turn the timeout into a hang at exit.
    if (stuck_) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_all();
  }

  // Runs `task` on the MPI thread and waits for it; for set-up calls, which have no deadline of their own.
  void run_sync(const std::function<void()>& task) {
    std::mutex done_mutex;
    std::condition_variable done_signal;
    bool done = false;
    std::exception_ptr error;
    submit([&] {
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(done_mutex);
      done = true;
      done_signal.notify_all();
    });
    std::unique_lock<std::mutex> lock(done_mutex);
    done_signal.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }

  // After a timeout the MPI thread may be blocked for good: exit must neither join it nor finalise MPI.
  void mark_stuck() { stuck_ = true; }

 private:
  MpiRuntime() {
    thread_ = std::thread([this] { loop(); });
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [this] { return started_; });
    if (init_error_) {
      stopping_ = true;
      lock.unlock();
      thread_.join();
      std::rethrow_exception(init_error_);
    }
  }

  void initialise() {
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

  void loop() {
    try {
      initialise();
    } catch (...) {
      init_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      started_ = true;
    }
    wake_.notify_all();
    if (init_error_) return;
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) break;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
    if (initialised_here_ && !stuck_) MPI_Finalize();
  }

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool started_ = false;
  bool stopping_ = false;
  std::exception_ptr init_error_;
  bool initialised_here_ = false;  // touched only by the MPI thread
  std::atomic<bool> stuck_{false};
};

// A duplicate of MPI_COMM_WORLD (so the program's own MPI traffic never matches ours) and whether a timeout
// has left it unusable. `comm` is touched only on the MPI thread.
struct MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::mutex mutex;
  std::string broken_reason;  // non-empty once a collective timed out

  std::string broken() {
    std::lock_guard<std::mutex> lock(mutex);
    return broken_reason;
  }
  void set_broken(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    if (broken_reason.empty()) broken_reason = reason;
  }
};

namespace {

// Largest piece of one all-reduce handed to MPI at a time (see all_reduce).
constexpr int64_t kAllreduceChunkBytes = int64_t{4} << 20;
// Largest message of the calls that are split rather than refused past MPI's int count (1 GiB).
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("{} failed: {}; a peer process has probably exited, see its output", call,
                              std::string(text, static_cast<size_t>(length))));
}

// Completion of one queued collective, shared between the MPI thread (which fills it) and the Work handle.
struct WorkState {
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::exception_ptr error;
  std::function<void()> observer;  // Work::observe_completion's, called once when done

  // On the MPI thread, once the collective has run.
  void finish() {
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      notify = std::move(observer);
      done_signal.notify_all();
    }
    if (notify) notify();
  }
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<WorkState> state, std::shared_ptr<MpiGroup> group, std::shared_ptr<MpiRuntime> runtime,
          std::string description, std::chrono::milliseconds timeout)
      : state_(std::move(state)),
        group_(std::move(group)),
        runtime_(std::move(runtime)),
        description_(std::move(description)),
        timeout_(timeout),
        deadline_(std::chrono::steady_clock::now() + timeout) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->done_signal.wait_until(lock, deadline_, [this] { return state_->done; })) {
      std::string message = fmt::format(
          "{} timed out after {:.0f} s: a peer never reached it or is stuck; every rank must issue the same "
          "collectives in the same order",
          description_, timeout_.count() / 1000.0);
      group_->set_broken(message);
      runtime_->mark_stuck();
      throw TimeoutError(message);
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done;
  }

  void observe_completion(std::function<void()> observer) override {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->done) {
        state_->observer = std::move(observer);
        return;
      }
    }
    observer();
  }

 private:
  std::shared_ptr<WorkState> state_;
  std::shared_ptr<MpiGroup> group_;
  std::shared_ptr<MpiRuntime> runtime_;
  std::string description_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
};

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // MPI has no average: a sum (see divides_before_sum)
      return MPI_SUM;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Max:
      return MPI_MAX;
  }
  TANDEM_CHECK(false, "unknown reduce op");
}

// Reductions need MPI to know the element type; copies (broadcast, all_gather) move bytes and take any dtype.
MPI_Datatype reduction_type(const torch::Tensor& tensor, const std::string& operation) {
  switch (tensor.scalar_type()) {
    case torch::kFloat32:
      return MPI_FLOAT;
    case torch::kFloat64:
      return MPI_DOUBLE;
    case torch::kInt32:
      return MPI_INT32_T;
    case torch::kInt64:
      return MPI_INT64_T;
    case torch::kInt16:
      return MPI_INT16_T;
    case torch::kInt8:
      return MPI_INT8_T;
    case torch::kUInt8:
      return MPI_UINT8_T;
    default:
      throw UnsupportedError(fmt::format("backend mpi does not support {} on {} tensors; convert to float32 or float64",
                                         operation, c10::toString(tensor.scalar_type())));
  }
}

void check_cpu(const torch::Tensor& tensor, const std::string& operation) {
  if (!tensor.device().is_cpu()) {
    throw UnsupportedError(fmt::format("backend mpi does not support {} on {} tensors; move them to the CPU or use "
                                       "backend nccl", operation, tensor.device().str()));
  }
}

int mpi_count(int64_t count, const std::string& operation) {
  if (count > INT_MAX) {
    throw UnsupportedError(fmt::format("backend mpi does not support {} of more than {} elements (got {}); split the "
                                       "tensor", operation, INT_MAX, count));
  }
  return static_cast<int>(count);
}

// MPI has no average: it is a sum of tensors divided by the world size first where they are floating point,
// so that large values cannot overflow in the sum; integers can only divide the sum.
bool divides_before_sum(const torch::Tensor& tensor) { return tensor.is_floating_point(); }

// Queues `body` on the MPI thread and returns the handle that waits for it.
WorkPtr enqueue(const std::shared_ptr<MpiRuntime>& runtime, const std::shared_ptr<MpiGroup>& group, int world_size,
                std::chrono::milliseconds timeout, const std::string& operation, std::function<void(MPI_Comm)> body) {
  if (std::string reason = group->broken(); !reason.empty()) {
    throw CommError(fmt::format("{} refused: the mpi communicator is unusable after an earlier failure ({})", operation,
                                reason));
  }
  auto state = std::make_shared<WorkState>();
  runtime->submit([state, group, operation, body = std::move(body)] {
    try {
      if (std::string reason = group->broken(); !reason.empty()) {
        throw CommError(fmt::format("{} was not run: the mpi communicator failed earlier ({})", operation, reason));
      }
      body(group->comm);
    } catch (...) {
      state->error = std::current_exception();
    }
    state->finish();
  });
  std::string description = fmt::format("{} on rank {}/{} (backend mpi)", operation, group->rank, world_size);
  return std::make_shared<MpiWork>(state, group, runtime, description, timeout);
}

}  // namespace

MpiCommunicator::MpiCommunicator(const RankLayout& layout, std::chrono::milliseconds timeout)
    : rank_(layout.rank), world_size_(layout.world_size), timeout_(timeout) {
  runtime_ = MpiRuntime::instance();
  group_ = std::make_shared<MpiGroup>();
  int mpi_rank = 0, mpi_size = 1;
  runtime_->run_sync([&] {
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "MPI_Comm_size");
  });
  if (mpi_rank != layout.rank || mpi_size != layout.world_size) {
    throw InvalidArgument(fmt::format(
        "MPI reports rank {} of {} but the rank layout (from {}) says rank {} of {}; start the mpi backend with "
        "`mpirun -np N` (or srun), not `tandem run`, or use --backend gloo",
        mpi_rank, mpi_size, layout.source, layout.rank, layout.world_size));
  }
  // Collective over MPI_COMM_WORLD: every rank constructs its communicator at the same point.
  auto group = group_;
  runtime_->run_sync([group] {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &group->comm), "MPI_Comm_dup");
    // Errors come back as codes (then CommError) rather than aborting the job inside MPI.
    MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(group->comm, &group->rank);
    MPI_Comm_size(group->comm, &group->size);
  });
}

MpiCommunicator::~MpiCommunicator() {
  // Freeing is collective in spirit but local in Open MPI; skip it when a timeout left MPI in doubt.
  if (!group_->broken().empty()) return;
  auto group = group_;
  runtime_->submit([group] {
    if (group->comm != MPI_COMM_NULL) MPI_Comm_free(&group->comm);
  });
}

WorkPtr MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  std::string operation = "all_reduce(" + to_string(op) + ")";
  check_cpu(tensor, operation);
  MPI_Datatype type = reduction_type(tensor, operation);
  MPI_Op mpi_op = to_mpi(op);
  torch::Tensor buffer = tensor.contiguous();
  return enqueue(runtime_, group_, world_size_, timeout_, operation,
                 [tensor, buffer, type, mpi_op, op, world = world_size_](MPI_Comm comm) mutable {
                   // Open MPI's shared-memory all-reduce slows several-fold past ~8 MB (measured: 3.8 GB/s at
                   // 8 MB, 0.7 GB/s at 64 MB on one host), so large tensors go in pieces that stay fast; that
                   // also keeps each call's count within MPI's int.
                   const int64_t count = buffer.numel();
                   const int64_t chunk = std::max<int64_t>(1, kAllreduceChunkBytes / buffer.element_size());
                   const bool average = op == ReduceOp::Avg;
                   const bool divide_first = divides_before_sum(buffer);
                   torch::Tensor flat = buffer.view(-1);
                   for (int64_t done = 0; done < count; done += chunk) {
                     const int64_t piece = std::min(chunk, count - done);
                     torch::Tensor slice = flat.narrow(0, done, piece);
                     // Piece by piece, while the piece is in cache, instead of a second pass from memory.
                     if (average && divide_first) slice.div_(world);
                     check_mpi(MPI_Allreduce(MPI_IN_PLACE, slice.data_ptr(), static_cast<int>(piece), type, mpi_op,
                                             comm),
                               "MPI_Allreduce");
                     if (average && !divide_first) slice.div_(world, "trunc");
                   }
                   if (!buffer.is_same(tensor)) tensor.copy_(buffer);
                 });
}

WorkPtr MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(fmt::format("broadcast root {} is outside world size {}", root, world_size_));
  }
  check_cpu(tensor, "broadcast");
  torch::Tensor buffer = tensor.contiguous();
  return enqueue(runtime_, group_, world_size_, timeout_, "broadcast", [tensor, buffer, root](MPI_Comm comm) mutable {
    // MPI counts in int: a model of over 2 GiB, which DDP broadcasts as one flat buffer, goes in pieces.
    auto* bytes = static_cast<char*>(buffer.data_ptr());
    const int64_t total = static_cast<int64_t>(buffer.nbytes());
    for (int64_t done = 0; done < total; done += kMaxMessageBytes) {
      const int64_t piece = std::min(kMaxMessageBytes, total - done);
      check_mpi(MPI_Bcast(bytes + done, static_cast<int>(piece), MPI_BYTE, root, comm), "MPI_Bcast");
    }
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  });
}

WorkPtr MpiCommunicator::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  if (static_cast<int>(outputs.size()) != world_size_) {
    throw InvalidArgument(
        fmt::format("all_gather needs {} output tensors (one per rank), got {}", world_size_, outputs.size()));
  }
  check_cpu(input, "all_gather");
  for (const auto& output : outputs) {
    check_cpu(output, "all_gather");
    if (output.numel() != input.numel() || output.scalar_type() != input.scalar_type()) {
      throw InvalidArgument(fmt::format("all_gather outputs must match the input ({} elements of {}), got {} of {}",
                                        input.numel(), c10::toString(input.scalar_type()), output.numel(),
                                        c10::toString(output.scalar_type())));
    }
  }
  int bytes = mpi_count(input.nbytes(), "all_gather");
  mpi_count(input.nbytes() * world_size_, "all_gather");
  torch::Tensor send = input.contiguous();
  // MPI gathers into one buffer; the caller's outputs are separate tensors, filled from it afterwards.
  torch::Tensor gathered = torch::empty({world_size_, input.numel()}, input.options());
  return enqueue(runtime_, group_, world_size_, timeout_, "all_gather",
                 [outputs, send, gathered, bytes](MPI_Comm comm) mutable {
                   check_mpi(MPI_Allgather(send.data_ptr(), bytes, MPI_BYTE, gathered.data_ptr(), bytes, MPI_BYTE,
                                           comm),
                             "MPI_Allgather");
                   for (size_t r = 0; r < outputs.size(); ++r) outputs[r].copy_(gathered[r].view(outputs[r].sizes()));
                 });
}

WorkPtr MpiCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  std::string operation = "reduce_scatter(" + to_string(op) + ")";
  if (input.numel() != output.numel() * world_size_) {
    throw InvalidArgument(fmt::format("reduce_scatter input has {} elements; it must be world size {} x output's {}",
                                      input.numel(), world_size_, output.numel()));
  }
  if (input.scalar_type() != output.scalar_type()) {
    throw InvalidArgument(fmt::format("reduce_scatter input is {} but output is {}; they must match",
                                      c10::toString(input.scalar_type()), c10::toString(output.scalar_type())));
  }
  check_cpu(input, operation);
  check_cpu(output, operation);
  MPI_Datatype type = reduction_type(input, operation);
  mpi_count(input.numel(), operation);
  int count = mpi_count(output.numel(), operation);
  MPI_Op mpi_op = to_mpi(op);
  const bool average = op == ReduceOp::Avg;
  const bool divide_first = divides_before_sum(input);
  // Divided into a new tensor: the caller's input is read-only here.
  torch::Tensor send = average && divide_first ? input.div(world_size_).contiguous() : input.contiguous();
  torch::Tensor receive = output.contiguous();
  return enqueue(runtime_, group_, world_size_, timeout_, operation,
                 [output, send, receive, type, count, mpi_op, divide_sum = average && !divide_first,
                  world = world_size_](MPI_Comm comm) mutable {
                   check_mpi(MPI_Reduce_scatter_block(send.data_ptr(), receive.data_ptr(), count, type, mpi_op, comm),
                             "MPI_Reduce_scatter_block");
                   if (divide_sum) receive.div_(world, "trunc");
                   if (!receive.is_same(output)) output.copy_(receive);
                 });
}

WorkPtr MpiCommunicator::barrier() {
  return enqueue(runtime_, group_, world_size_, timeout_, "barrier",
                 [](MPI_Comm comm) { check_mpi(MPI_Barrier(comm), "MPI_Barrier"); });
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
