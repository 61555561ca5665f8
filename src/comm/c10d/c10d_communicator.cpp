#include "tandem/comm/c10d/c10d_communicator.h"

#include <fmt/format.h>

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

void divide_in_place(torch::Tensor& tensor, int divisor) {
  if (tensor.is_floating_point() || tensor.is_complex()) {
    tensor.div_(divisor);
  } else {
    tensor.div_(divisor, "trunc");
  }
}

// A c10d work plus what must happen once it completes (averaging, copying a chunk out).
class C10dWork : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::string operation, uint64_t sequence,
           std::shared_ptr<CollectiveTracker> tracker, std::chrono::milliseconds timeout,
           std::function<void()> on_complete)
      : work_(std::move(work)),
        operation_(std::move(operation)),
        sequence_(sequence),
        tracker_(std::move(tracker)),
        timeout_(timeout),
        on_complete_(std::move(on_complete)) {}

  void wait() override {
    if (finished_) return;
    try {
      work_->wait();
    } catch (const std::exception& error) {
      tracker_->fail(operation_, sequence_, error.what(), timeout_);
    }
    if (on_complete_) on_complete_();
    finished_ = true;
  }

  bool is_completed() override { return finished_ || work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string operation_;
  uint64_t sequence_;
  std::shared_ptr<CollectiveTracker> tracker_;
  std::chrono::milliseconds timeout_;
  std::function<void()> on_complete_;
  bool finished_ = false;
};

}  // namespace

C10dCommunicator::C10dCommunicator(std::string backend_name, StorePtr store, int rank, int world_size,
                                   std::chrono::milliseconds timeout)
    : backend_name_(std::move(backend_name)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      tracker_(std::make_shared<CollectiveTracker>(std::move(store), rank, world_size)) {}

void C10dCommunicator::connect(const std::function<c10::intrusive_ptr<compat::C10dBackend>()>& create,
                               Capabilities capabilities) {
  capabilities_ = capabilities;
  try {
    group_ = create();
  } catch (const std::exception& error) {
    tracker_->fail(backend_name_ + " connect", 0, error.what(), timeout_);
  }
}

WorkPtr C10dCommunicator::wrap(c10::intrusive_ptr<c10d::Work> work, const std::string& operation, uint64_t sequence,
                               std::function<void()> on_complete) {
  return std::make_shared<C10dWork>(std::move(work), operation, sequence, tracker_, timeout_, std::move(on_complete));
}

WorkPtr C10dCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  uint64_t sequence = tracker_->begin();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  std::function<void()> finish;
  if (op == ReduceOp::Avg && !capabilities_.average) {
    options.reduceOp = c10d::ReduceOp::SUM;
    finish = [tensor, world = world_size_]() mutable { divide_in_place(tensor, world); };
  } else {
    options.reduceOp = to_c10d(op);
  }
  return wrap(group_->allreduce(tensors, options), "all_reduce(" + to_string(op) + ")", sequence, std::move(finish));
}

WorkPtr C10dCommunicator::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(fmt::format("broadcast root {} is outside world size {}", root, world_size_));
  }
  uint64_t sequence = tracker_->begin();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return wrap(group_->broadcast(tensors, options), "broadcast", sequence, nullptr);
}

WorkPtr C10dCommunicator::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  if (static_cast<int>(outputs.size()) != world_size_) {
    throw InvalidArgument(
        fmt::format("all_gather needs {} output tensors (one per rank), got {}", world_size_, outputs.size()));
  }
  uint64_t sequence = tracker_->begin();
  std::vector<std::vector<torch::Tensor>> output_lists{outputs};
  std::vector<torch::Tensor> inputs{input};
  return wrap(group_->allgather(output_lists, inputs), "all_gather", sequence, nullptr);
}

WorkPtr C10dCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  if (input.numel() != output.numel() * world_size_) {
    throw InvalidArgument(fmt::format("reduce_scatter input has {} elements; it must be world size {} x output's {}",
                                      input.numel(), world_size_, output.numel()));
  }
  std::string operation = "reduce_scatter(" + to_string(op) + ")";
  uint64_t sequence = tracker_->begin();
  if (capabilities_.reduce_scatter && (op != ReduceOp::Avg || capabilities_.average)) {
    std::vector<torch::Tensor> outputs{output};
    std::vector<std::vector<torch::Tensor>> inputs{input.contiguous().view({world_size_, -1}).unbind(0)};
    for (auto& chunk : inputs[0]) chunk = chunk.view(output.sizes());
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    return wrap(group_->reduce_scatter(outputs, inputs, options), operation, sequence, nullptr);
  }
  // Emulated: all-reduce a copy and keep this rank's chunk.
  torch::Tensor reduced = input.contiguous().clone();
  std::vector<torch::Tensor> tensors{reduced};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op == ReduceOp::Avg ? ReduceOp::Sum : op);
  auto finish = [output, reduced, op, rank = rank_, world = world_size_]() mutable {
    torch::Tensor mine = reduced.view({world, -1})[rank].view(output.sizes());
    if (op == ReduceOp::Avg) divide_in_place(mine, world);
    output.copy_(mine);
  };
  return wrap(group_->allreduce(tensors, options), operation, sequence, std::move(finish));
}

WorkPtr C10dCommunicator::barrier() {
  uint64_t sequence = tracker_->begin();
  return wrap(group_->barrier(), "barrier", sequence, nullptr);
}

}  // namespace tandem::comm
