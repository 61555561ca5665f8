#include "tandem/comm/c10d/c10d_communicator.h"

#include <fmt/format.h>

#include <utility>

#include "tandem/comm/work_deadline.h"
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

// c10d refuses some dtypes (Gloo in LibTorch 1.13 has no bfloat16): that is this rank's limitation, not a
// peer's, so it becomes UnsupportedError, which the base does not blame on the other ranks. Other failures
// go on as they are.
[[noreturn]] void rethrow_worded(const std::exception& error, const std::string& backend, const std::string& operation,
                                 const torch::Tensor& tensor) {
  const std::string message = error.what();
  if (message.find("Invalid scalar type") != std::string::npos || message.find("Unsupported") != std::string::npos) {
    std::string what = tensor.defined() ? std::string(c10::toString(tensor.scalar_type())) + " tensors" : "this";
    throw UnsupportedError(fmt::format("backend {} does not support {} in {}; use another dtype or backend", backend,
                                       what, operation));
  }
  throw;
}

class C10dWork : public Work {
 public:
  // `deadline`: the host polls the work until then before c10d's wait(); none where c10d's wait() keeps time.
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::string backend, std::string operation, torch::Tensor tensor,
           std::optional<WorkDeadline> deadline)
      : work_(std::move(work)),
        backend_(std::move(backend)),
        operation_(std::move(operation)),
        tensor_(std::move(tensor)),
        deadline_(std::move(deadline)) {}

  void wait() override {
    if (finished_) return;
    try {
      if (deadline_) deadline_->wait([this] { return work_->isCompleted(); });
      work_->wait();
    } catch (const std::exception& error) {
      rethrow_worded(error, backend_, operation_, tensor_);
    }
    finished_ = true;
    if (observer_at_wait_) std::exchange(observer_at_wait_, nullptr)();
  }

  bool is_completed() override { return finished_ || work_->isCompleted(); }

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
  std::string backend_;
  std::string operation_;
  torch::Tensor tensor_;
  std::optional<WorkDeadline> deadline_;
  bool finished_ = false;
  std::function<void()> observer_at_wait_;
};

}  // namespace

C10dCommunicator::C10dCommunicator(std::string backend_name, StorePtr store, int rank, int world_size,
                                   std::chrono::milliseconds timeout, Capabilities capabilities, torch::Device device,
                                   Completion completion)
    : Communicator(std::move(backend_name), std::move(store), rank, world_size, timeout, capabilities, device),
      completion_(completion) {}

C10dCommunicator::~C10dCommunicator() {
  if (group_) compat::release_communicators(*group_);
}

void C10dCommunicator::connect(const std::function<c10::intrusive_ptr<compat::C10dBackend>()>& create) {
  try {
    group_ = create();
  } catch (const std::exception& error) {
    report_connect_failure(error.what());
  }
}

WorkPtr C10dCommunicator::wrap(const std::string& operation, const torch::Tensor& tensor,
                               const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  std::optional<WorkDeadline> deadline;
  if (completion_ == Completion::kPollUntilDeadline) {
    deadline.emplace(backend_name() + " " + operation, WorkDeadline::Clock::now(), timeout());
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start();
  } catch (const std::exception& error) {
    rethrow_worded(error, backend_name(), operation, tensor);
  }
  return std::make_shared<C10dWork>(std::move(work), backend_name(), operation, tensor, std::move(deadline));
}

WorkPtr C10dCommunicator::start_all_reduce(torch::Tensor& tensor, ReduceOp op) {
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  return wrap("all_reduce(" + to_string(op) + ")", tensor, [&] { return group_->allreduce(tensors, options); });
}

WorkPtr C10dCommunicator::start_broadcast(torch::Tensor& tensor, int root) {
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return wrap("broadcast", tensor, [&] { return group_->broadcast(tensors, options); });
}

WorkPtr C10dCommunicator::start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  std::vector<std::vector<torch::Tensor>> output_lists{outputs};
  std::vector<torch::Tensor> inputs{input};
  return wrap("all_gather", input, [&] { return group_->allgather(output_lists, inputs); });
}

WorkPtr C10dCommunicator::start_all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  torch::Tensor sent = input;  // c10d takes the input by non-const reference; it does not write it
  return wrap("all_gather_into", input, [&] { return group_->_allgather_base(output, sent); });
}

WorkPtr C10dCommunicator::start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  std::vector<torch::Tensor> outputs{output};
  std::vector<std::vector<torch::Tensor>> inputs{input.contiguous().view({world_size(), -1}).unbind(0)};
  for (auto& chunk : inputs[0]) chunk = chunk.view(output.sizes());
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  return wrap("reduce_scatter(" + to_string(op) + ")", input,
              [&] { return group_->reduce_scatter(outputs, inputs, options); });
}

WorkPtr C10dCommunicator::start_barrier() {
  return wrap("barrier", torch::Tensor(), [&] { return group_->barrier(); });
}

}  // namespace tandem::comm
