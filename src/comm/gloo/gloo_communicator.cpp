#include "tandem/comm/gloo/gloo_communicator.h"

#include <fmt/format.h>

#include <cstdlib>
#include <functional>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // Gloo has no average: sum, then divide when the work completes.
      return c10d::ReduceOp::SUM;
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

// A c10d work plus what must happen once it completes (averaging, copying a chunk out); failures become
// tandem errors naming the collective and the ranks that never reached it.
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string operation, uint64_t sequence,
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

// GLOO_SOCKET_IFNAME picks the interface, as in PyTorch; otherwise the given address, or the one the host
// name resolves to.
std::shared_ptr<::gloo::transport::Device> make_device(const std::string& hostname) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (hostname.empty()) return c10d::ProcessGroupGloo::createDefaultDevice();
  return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
}

}  // namespace

GlooCommunicator::GlooCommunicator(StorePtr store, int rank, int world_size, std::chrono::milliseconds timeout,
                                   const GlooOptions& options)
    : rank_(rank), world_size_(world_size), timeout_(timeout) {
  tracker_ = std::make_shared<CollectiveTracker>(store, rank, world_size);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo_options->devices.push_back(make_device(options.hostname));
  gloo_options->threads = options.threads;
  try {
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
  } catch (const std::exception& error) {
    tracker_->fail("gloo connect", 0, error.what(), timeout);
  }
}

WorkPtr GlooCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  uint64_t sequence = tracker_->begin();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  std::function<void()> finish;
  if (op == ReduceOp::Avg) finish = [tensor, world = world_size_]() mutable { divide_in_place(tensor, world); };
  return std::make_shared<GlooWork>(group_->allreduce(tensors, options), "all_reduce(" + to_string(op) + ")",
                                    sequence, tracker_, timeout_, std::move(finish));
}

WorkPtr GlooCommunicator::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(fmt::format("broadcast root {} is outside world size {}", root, world_size_));
  }
  uint64_t sequence = tracker_->begin();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return std::make_shared<GlooWork>(group_->broadcast(tensors, options), "broadcast", sequence, tracker_, timeout_,
                                    nullptr);
}

WorkPtr GlooCommunicator::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  if (static_cast<int>(outputs.size()) != world_size_) {
    throw InvalidArgument(
        fmt::format("all_gather needs {} output tensors (one per rank), got {}", world_size_, outputs.size()));
  }
  uint64_t sequence = tracker_->begin();
  std::vector<std::vector<torch::Tensor>> output_lists{outputs};
  std::vector<torch::Tensor> inputs{input};
  return std::make_shared<GlooWork>(group_->allgather(output_lists, inputs), "all_gather", sequence, tracker_,
                                    timeout_, nullptr);
}

WorkPtr GlooCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  if (input.numel() != output.numel() * world_size_) {
    throw InvalidArgument(fmt::format("reduce_scatter input has {} elements; it must be world size {} x output's {}",
                                      input.numel(), world_size_, output.numel()));
  }
  // c10d's Gloo group has no reduce-scatter: all-reduce a copy and keep this rank's chunk.
  torch::Tensor reduced = input.contiguous().clone();
  std::vector<torch::Tensor> tensors{reduced};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  uint64_t sequence = tracker_->begin();
  auto finish = [output, reduced, op, rank = rank_, world = world_size_]() mutable {
    torch::Tensor mine = reduced.view({world, -1})[rank].view(output.sizes());
    if (op == ReduceOp::Avg) divide_in_place(mine, world);
    output.copy_(mine);
  };
  return std::make_shared<GlooWork>(group_->allreduce(tensors, options), "reduce_scatter(" + to_string(op) + ")",
                                    sequence, tracker_, timeout_, std::move(finish));
}

WorkPtr GlooCommunicator::barrier() {
  uint64_t sequence = tracker_->begin();
  return std::make_shared<GlooWork>(group_->barrier(), "barrier", sequence, tracker_, timeout_, nullptr);
}

}  // namespace tandem::comm
