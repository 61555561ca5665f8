#include "tandem/comm/communicator.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "tandem/comm/collective_tracker.h"
#include "tandem/util/error.h"

namespace tandem::comm {

struct Communicator::Abandonment {
  std::mutex mutex;
  std::condition_variable changed;
  bool abandoned = false;

  // Where the backend can tell only inside wait() that a work completed (a GPU collective), it is polled this often.
  static constexpr std::chrono::milliseconds kPollSlice{1};
};

namespace {

// Waits until `work` completes, or throws CommError naming `operation` when `abandonment` is set first. The backend
// says when the work completes (observe_completion), on its own thread.
void wait_unless_abandoned(const std::shared_ptr<Communicator::Abandonment>& abandonment, Work& work,
                           const std::string& operation) {
  work.observe_completion([abandonment] {
    { std::lock_guard<std::mutex> lock(abandonment->mutex); }
    abandonment->changed.notify_all();
  });
  std::unique_lock<std::mutex> lock(abandonment->mutex);
  while (!abandonment->abandoned && !work.is_completed()) {
    abandonment->changed.wait_for(lock, Communicator::Abandonment::kPollSlice);
  }
  if (!abandonment->abandoned || work.is_completed()) return;
  throw CommError(fmt::format("{} abandoned: the job's membership changed while it waited (in-job recovery)",
                              operation));
}

// A backend's work wrapped with what the base adds: failures reported through the tracker, the end of an
// emulation, run once the backend's part has completed, and under a membership a wait that can be abandoned.
class TrackedWork : public Work {
 public:
  TrackedWork(WorkPtr backend_work, std::function<void()> on_complete,
              std::function<void(const std::exception&)> report_failure,
              std::shared_ptr<Communicator::Abandonment> abandonment, std::string operation)
      : backend_work_(std::move(backend_work)),
        on_complete_(std::move(on_complete)),
        report_failure_(std::move(report_failure)),
        abandonment_(std::move(abandonment)),
        operation_(std::move(operation)) {}

  void wait() override {
    if (finished_) return;
    try {
      if (abandonment_) wait_unless_abandoned(abandonment_, *backend_work_, operation_);
      backend_work_->wait();
    } catch (const UnsupportedError&) {
      throw;
    } catch (const InvalidArgument&) {
      throw;
    } catch (const std::exception& error) {
      report_failure_(error);
    }
    if (on_complete_) on_complete_();
    finished_ = true;
  }

  // The caller's tensor holds the result only once on_complete_ has run, so completing the work runs it too.
  // Throws the collective's error, as wait() would.
  bool is_completed() override {
    if (!finished_ && backend_work_->is_completed()) wait();
    return finished_;
  }

  void observe_completion(std::function<void()> observer) override {
    backend_work_->observe_completion(std::move(observer));
  }

 private:
  WorkPtr backend_work_;
  std::function<void()> on_complete_;
  std::function<void(const std::exception&)> report_failure_;
  std::shared_ptr<Communicator::Abandonment> abandonment_;
  std::string operation_;
  bool finished_ = false;
};

// How a reduction travels: `op` where the backend has it; an emulated average as a sum whose input or whose
// result is divided by the world size.
struct WireReduction {
  ReduceOp op;
  bool divide_input = false;
  bool divide_result = false;
};

WireReduction wire_reduction(ReduceOp op, bool native_average, const torch::Tensor& tensor) {
  if (op != ReduceOp::Avg || native_average) return {op};
  // Dividing first keeps a half-precision sum of large values in range; integers can only divide the sum.
  const bool divide_first = tensor.is_floating_point() || tensor.is_complex();
  return {ReduceOp::Sum, divide_first, !divide_first};
}

// Only integer sums are divided afterwards (see wire_reduction).
void divide_sum(torch::Tensor& tensor, int world_size) { tensor.div_(world_size, "trunc"); }

std::string dtype_name(const torch::Tensor& tensor) { return c10::toString(tensor.scalar_type()); }

CollectiveSignature signature_of(std::string kind, const torch::Tensor& tensor) {
  return {std::move(kind), tensor.scalar_type(), tensor.numel()};
}

// TANDEM_DISTRIBUTED_DEBUG, as PyTorch's TORCH_DISTRIBUTED_DEBUG: DETAIL compares every collective's signature
// across the ranks before it starts.
bool compare_before_every_collective() {
  const char* level = std::getenv("TANDEM_DISTRIBUTED_DEBUG");
  if (!level || std::string(level).empty() || std::string(level) == "OFF") return false;
  if (std::string(level) == "DETAIL") return true;
  throw InvalidArgument(fmt::format("TANDEM_DISTRIBUTED_DEBUG={} is not a debug level; use DETAIL (compare every "
                                    "collective across the ranks before it starts) or OFF",
                                    level));
}

// What a backend is handed: a complex tensor as a view of (real, imaginary) pairs, as PyTorch's
// torch.distributed does, since neither c10d's Gloo nor MPI's reductions here know complex types. The view
// shares the caller's memory, so in-place results land in the complex tensor.
torch::Tensor on_wire(const torch::Tensor& tensor) {
  return tensor.is_complex() ? torch::view_as_real(tensor) : tensor;
}

void check_defined_for_complex(const torch::Tensor& tensor, ReduceOp op, const std::string& operation) {
  if (tensor.is_complex() && (op == ReduceOp::Min || op == ReduceOp::Max)) {
    throw InvalidArgument(fmt::format("{} of {} tensors: complex numbers have no order; use sum or avg", operation,
                                      dtype_name(tensor)));
  }
}

}  // namespace

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
  }
  return "unknown";
}

Communicator::Communicator(std::string backend_name, StorePtr store, int rank, int world_size,
                           std::chrono::milliseconds timeout, Capabilities capabilities, torch::Device device)
    : backend_name_(std::move(backend_name)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      capabilities_(capabilities),
      device_(device),
      compare_before_every_collective_(compare_before_every_collective()),
      tracker_(std::make_shared<CollectiveTracker>(std::move(store), rank, world_size)) {}

void Communicator::serve_membership() {
  diagnose_failures_ = false;
  abandonment_ = std::make_shared<Abandonment>();
}

void Communicator::abandon_waits() {
  TANDEM_CHECK(abandonment_, "abandon_waits() on a communicator that serves no membership");
  {
    std::lock_guard<std::mutex> lock(abandonment_->mutex);
    abandonment_->abandoned = true;
  }
  abandonment_->changed.notify_all();
}

Communicator::~Communicator() = default;

WorkPtr Communicator::start_all_gather_into(torch::Tensor&, const torch::Tensor&) {
  TANDEM_CHECK(false, "backend ", backend_name_, " claims an all-gather into one tensor it does not implement");
}

WorkPtr Communicator::start_reduce_scatter(torch::Tensor&, const torch::Tensor&, ReduceOp) {
  TANDEM_CHECK(false, "backend ", backend_name_, " claims a reduce-scatter it does not implement");
}

void Communicator::report_connect_failure(const std::string& backend_message) {
  tracker_->fail(backend_name_ + " connect", 0, backend_message, timeout_);
}

void Communicator::check_device(const torch::Tensor& tensor, const std::string& operation) const {
  const auto& wanted = capabilities_.tensor_device;
  if (!wanted || tensor.device().type() == *wanted) return;
  const std::string advice = *wanted == torch::kCUDA ? "move them to the GPU (`device` cuda) or use `backend` gloo"
                                                     : "move them to the CPU or use `backend` nccl";
  throw UnsupportedError(fmt::format("backend {} does not support {} tensors in {}; {}", backend_name_,
                                     tensor.device().str(), operation, advice));
}

WorkPtr Communicator::issue(CollectiveSignature signature, const std::function<WorkPtr()>& start,
                            std::function<void()> on_complete) {
  const std::string operation = signature.kind;
  const uint64_t sequence = tracker_->begin(std::move(signature));
  if (compare_before_every_collective_) tracker_->agree(sequence, timeout_);
  auto report_failure = [tracker = tracker_, operation, sequence, timeout = timeout_, diagnose = diagnose_failures_,
                         where = fmt::format("{}/{}", rank_, world_size_)](const std::exception& error) {
    if (!diagnose) {
      throw CommError(fmt::format("{} #{} on rank {} failed: {}", operation, sequence, where, first_line(error.what())));
    }
    tracker->fail(operation, sequence, error.what(), timeout);
  };
  WorkPtr backend_work;
  try {
    backend_work = start();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    report_failure(error);
  }
  return std::make_shared<TrackedWork>(std::move(backend_work), std::move(on_complete), std::move(report_failure),
                                       abandonment_, operation);
}

WorkPtr Communicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  const std::string operation = "all_reduce(" + to_string(op) + ")";
  check_device(tensor, operation);
  check_defined_for_complex(tensor, op, operation);
  const WireReduction wire = wire_reduction(op, capabilities_.average, tensor);
  if (wire.divide_input) tensor.div_(world_size_);
  std::function<void()> finish;
  if (wire.divide_result) finish = [tensor, world = world_size_]() mutable { divide_sum(tensor, world); };
  torch::Tensor sent = on_wire(tensor);
  return issue(signature_of(operation, tensor), [&] { return start_all_reduce(sent, wire.op); }, std::move(finish));
}

WorkPtr Communicator::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(fmt::format("broadcast root {} is outside world size {}", root, world_size_));
  }
  check_device(tensor, "broadcast");
  torch::Tensor sent = on_wire(tensor);
  return issue(signature_of(fmt::format("broadcast(root {})", root), tensor),
               [&] { return start_broadcast(sent, root); });
}

WorkPtr Communicator::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  if (static_cast<int>(outputs.size()) != world_size_) {
    throw InvalidArgument(
        fmt::format("all_gather needs {} output tensors (one per rank), got {}", world_size_, outputs.size()));
  }
  check_device(input, "all_gather");
  for (const auto& output : outputs) {
    check_device(output, "all_gather");
    if (output.numel() != input.numel() || output.scalar_type() != input.scalar_type()) {
      throw InvalidArgument(fmt::format("all_gather outputs must match the input ({} elements of {}), got {} of {}",
                                        input.numel(), dtype_name(input), output.numel(), dtype_name(output)));
    }
  }
  std::vector<torch::Tensor> received;
  for (const auto& output : outputs) received.push_back(on_wire(output));
  return issue(signature_of("all_gather", input), [&] { return start_all_gather(received, on_wire(input)); });
}

WorkPtr Communicator::all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  if (output.numel() != input.numel() * world_size_) {
    throw InvalidArgument(fmt::format("all_gather_into output has {} elements; it must be world size {} x input's {}",
                                      output.numel(), world_size_, input.numel()));
  }
  if (output.scalar_type() != input.scalar_type()) {
    throw InvalidArgument(fmt::format("all_gather_into input is {} but output is {}; they must match",
                                      dtype_name(input), dtype_name(output)));
  }
  if (!output.is_contiguous()) {
    throw InvalidArgument("all_gather_into needs a contiguous output tensor; pass output.contiguous() and use it");
  }
  check_device(input, "all_gather_into");
  check_device(output, "all_gather_into");
  torch::Tensor received = on_wire(output);
  torch::Tensor sent = on_wire(input.contiguous());
  if (capabilities_.all_gather_into) {
    // Flat on both sides: 2.x's Gloo cuts the output into world-size pieces along its first dimension and wants
    // each piece shaped as the input, which a multi-dimensional input is not.
    torch::Tensor flat_received = received.view({-1});
    torch::Tensor flat_sent = sent.view({-1});
    return issue(signature_of("all_gather_into", input),
                 [&] { return start_all_gather_into(flat_received, flat_sent); });
  }
  // Emulated: the list all-gather writes straight into views of the output's slices.
  std::vector<torch::Tensor> slices;
  for (const auto& slice : received.view({world_size_, -1}).unbind(0)) slices.push_back(slice.view(sent.sizes()));
  return issue(signature_of("all_gather_into", input), [&] { return start_all_gather(slices, sent); });
}

WorkPtr Communicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const std::string operation = "reduce_scatter(" + to_string(op) + ")";
  if (input.numel() != output.numel() * world_size_) {
    throw InvalidArgument(fmt::format("reduce_scatter input has {} elements; it must be world size {} x output's {}",
                                      input.numel(), world_size_, output.numel()));
  }
  if (input.scalar_type() != output.scalar_type()) {
    throw InvalidArgument(fmt::format("reduce_scatter input is {} but output is {}; they must match",
                                      dtype_name(input), dtype_name(output)));
  }
  check_device(input, operation);
  check_device(output, operation);
  check_defined_for_complex(input, op, operation);
  const WireReduction wire = wire_reduction(op, capabilities_.average, input);
  // The caller's input is read-only here: a division goes into a new tensor.
  torch::Tensor send = wire.divide_input ? input.div(world_size_) : input;
  if (capabilities_.reduce_scatter) {
    std::function<void()> finish;
    if (wire.divide_result) finish = [output, world = world_size_]() mutable { divide_sum(output, world); };
    torch::Tensor received = on_wire(output);
    return issue(signature_of(operation, input), [&] { return start_reduce_scatter(received, on_wire(send), wire.op); },
                 std::move(finish));
  }
  // Emulated: all-reduce a copy of the whole input and keep this rank's chunk.
  torch::Tensor reduced = send.is_same(input) ? input.contiguous().clone() : send.contiguous();
  auto finish = [output, reduced, divide = wire.divide_result, rank = rank_, world = world_size_]() mutable {
    torch::Tensor mine = reduced.view({world, -1})[rank].view(output.sizes());
    if (divide) divide_sum(mine, world);
    output.copy_(mine);
  };
  torch::Tensor sent = on_wire(reduced);
  return issue(signature_of(operation, input), [&] { return start_all_reduce(sent, wire.op); }, std::move(finish));
}

WorkPtr Communicator::barrier() {
  return issue(CollectiveSignature{"barrier", std::nullopt, 0}, [&] { return start_barrier(); });
}

}  // namespace tandem::comm
