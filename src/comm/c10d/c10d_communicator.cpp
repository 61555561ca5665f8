#include "tandem/comm/c10d/c10d_communicator.h"

#include <fmt/format.h>

#include <utility>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Avg:
      return c10d::ReduceOp::AVG;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
  }
  TANDEM_CHECK(false, "unknown reduce op");
}

// Average by a sum where the backend has no average: a floating-point tensor is divided before the sum, so
// that a half-precision sum of large values stays in range; integers can only divide the sum.
bool divides_before_sum(const torch::Tensor& tensor) { return tensor.is_floating_point() || tensor.is_complex(); }

// Everything needed to report a failed collective, whether it failed when issued or while waited on.
struct Failure {
  std::string backend;
  std::string operation;
  uint64_t sequence;
  std::shared_ptr<CollectiveTracker> tracker;
  std::chrono::milliseconds timeout;

  [[noreturn]] void raise(const std::string& message, const torch::Tensor& tensor) const {
    // c10d refuses some dtypes (Gloo in LibTorch 1.13 has no bfloat16): that is this rank's limitation, not
    // a peer's, so it must not be reported as one.
    if (message.find("Invalid scalar type") != std::string::npos ||
        message.find("Unsupported") != std::string::npos) {
      std::string what = tensor.defined() ? std::string(c10::toString(tensor.scalar_type())) + " tensors" : "this";
      throw UnsupportedError(fmt::format("backend {} does not support {} in {}; use another dtype or backend",
                                         backend, what, operation));
    }
    tracker->fail(operation, sequence, message, timeout);
  }
};

// A c10d work plus what must happen once it completes (averaging, copying a chunk out).
class C10dWork : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, Failure failure, torch::Tensor tensor,
           std::function<void()> on_complete)
      : work_(std::move(work)),
        failure_(std::move(failure)),
        tensor_(std::move(tensor)),
        on_complete_(std::move(on_complete)) {}

  void wait() override {
    if (finished_) return;
    try {
      work_->wait();
    } catch (const std::exception& error) {
      failure_.raise(error.what(), tensor_);
    }
    if (on_complete_) on_complete_();
    finished_ = true;
    if (observer_at_wait_) std::exchange(observer_at_wait_, nullptr)();
  }

  // The caller's tensor holds the result only once on_complete_ has run, so completing the work runs it too.
  // Throws the collective's error, as wait() would.
  bool is_completed() override {
    if (!finished_ && work_->isCompleted()) wait();
    return finished_;
  }

  void observe_completion(std::function<void()> observer) override {
    // A GPU collective's future completes once the collective is queued on its stream, long before it has run;
    // only wait() knows more.
    if (tensor_.defined() && !tensor_.is_cuda()) {
      try {
        work_->getFuture()->addCallback([observer](c10::ivalue::Future&) { observer(); });
        return;
      } catch (const std::exception&) {
        // This work has no future (c10d leaves some optional): wait() tells instead.
      }
    }
    if (finished_) {
      observer();
    } else {
      observer_at_wait_ = std::move(observer);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  Failure failure_;
  torch::Tensor tensor_;
  std::function<void()> on_complete_;
  bool finished_ = false;
  std::function<void()> observer_at_wait_;
};

}  // namespace

C10dCommunicator::C10dCommunicator(std::string backend_name, StorePtr store, int rank, int world_size,
                                   std::chrono::milliseconds timeout, torch::Device device)
    : backend_name_(std::move(backend_name)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      device_(device),
      tracker_(std::make_shared<CollectiveTracker>(std::move(store), rank, world_size)) {}

C10dCommunicator::~C10dCommunicator() {
  if (group_) compat::release_communicators(*group_);
}

void C10dCommunicator::connect(const std::function<c10::intrusive_ptr<compat::C10dBackend>()>& create,
                               Capabilities capabilities) {
  capabilities_ = capabilities;
  try {
    group_ = create();
  } catch (const std::exception& error) {
    tracker_->fail(backend_name_ + " connect", 0, error.what(), timeout_);
  }
}

WorkPtr C10dCommunicator::issue(const std::string& operation, const torch::Tensor& tensor,
                                const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                                std::function<void()> on_complete) {
  if (capabilities_.cuda_tensors_only && tensor.defined() && !tensor.is_cuda()) {
    throw UnsupportedError(fmt::format("backend {} does not support {} tensors in {}; move them to the GPU "
                                       "(--device cuda) or use --backend gloo",
                                       backend_name_, tensor.device().str(), operation));
  }
  Failure failure{backend_name_, operation, tracker_->begin(), tracker_, timeout_};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start();
  } catch (const std::exception& error) {
    failure.raise(error.what(), tensor);
  }
  return std::make_shared<C10dWork>(std::move(work), std::move(failure), tensor, std::move(on_complete));
}

WorkPtr C10dCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  std::function<void()> finish;
  if (op == ReduceOp::Avg && !capabilities_.average) {
    options.reduceOp = c10d::ReduceOp::SUM;
    if (divides_before_sum(tensor)) {
      tensor.div_(world_size_);
    } else {
      finish = [tensor, world = world_size_]() mutable { tensor.div_(world, "trunc"); };
    }
  } else {
    options.reduceOp = to_c10d(op);
  }
  return issue("all_reduce(" + to_string(op) + ")", tensor, [&] { return group_->allreduce(tensors, options); },
               std::move(finish));
}

WorkPtr C10dCommunicator::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(fmt::format("broadcast root {} is outside world size {}", root, world_size_));
  }
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return issue("broadcast", tensor, [&] { return group_->broadcast(tensors, options); }, nullptr);
}

WorkPtr C10dCommunicator::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  if (static_cast<int>(outputs.size()) != world_size_) {
    throw InvalidArgument(
        fmt::format("all_gather needs {} output tensors (one per rank), got {}", world_size_, outputs.size()));
  }
  std::vector<std::vector<torch::Tensor>> output_lists{outputs};
  std::vector<torch::Tensor> inputs{input};
  return issue("all_gather", input, [&] { return group_->allgather(output_lists, inputs); }, nullptr);
}

WorkPtr C10dCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  if (input.numel() != output.numel() * world_size_) {
    throw InvalidArgument(fmt::format("reduce_scatter input has {} elements; it must be world size {} x output's {}",
                                      input.numel(), world_size_, output.numel()));
  }
  std::string operation = "reduce_scatter(" + to_string(op) + ")";
  if (capabilities_.reduce_scatter && (op != ReduceOp::Avg || capabilities_.average)) {
    std::vector<torch::Tensor> outputs{output};
    std::vector<std::vector<torch::Tensor>> inputs{input.contiguous().view({world_size_, -1}).unbind(0)};
    for (auto& chunk : inputs[0]) chunk = chunk.view(output.sizes());
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    return issue(operation, input, [&] { return group_->reduce_scatter(outputs, inputs, options); }, nullptr);
  }
  // Emulated: all-reduce a copy and keep this rank's chunk.
  torch::Tensor reduced = input.contiguous().clone();
  std::vector<torch::Tensor> tensors{reduced};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op == ReduceOp::Avg ? ReduceOp::Sum : op);
  const bool divide_sum = op == ReduceOp::Avg && !divides_before_sum(reduced);
  if (op == ReduceOp::Avg && !divide_sum) reduced.div_(world_size_);
  auto finish = [output, reduced, divide_sum, rank = rank_, world = world_size_]() mutable {
    torch::Tensor mine = reduced.view({world, -1})[rank].view(output.sizes());
    if (divide_sum) mine.div_(world, "trunc");
    output.copy_(mine);
  };
  return issue(operation, input, [&] { return group_->allreduce(tensors, options); }, std::move(finish));
}

WorkPtr C10dCommunicator::barrier() {
  return issue("barrier", torch::Tensor(), [&] { return group_->barrier(); }, nullptr);
}

}  // namespace tandem::comm
