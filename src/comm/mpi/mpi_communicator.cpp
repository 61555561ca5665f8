#include "tandem/comm/mpi/mpi_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "mpi_api.h"
#include "mpi_runtime.h"
#include "mpi_work.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Largest piece of one all-reduce handed to MPI at a time (see start_all_reduce).
constexpr int64_t kAllreduceChunkBytes = int64_t{4} << 20;
// Largest message of the calls that are split rather than refused past MPI's int count (1 GiB).
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Avg:
      return MPI_SUM;  // MPI has none: a sum of pieces divided on the MPI thread (all_reduce_in_pieces)
  }
  TANDEM_CHECK(false, "reduce op ", to_string(op), " reached the mpi backend");
}

// An average divides floating-point values before the sum (as the communicator base would, keeping a sum of
// large values in range) and integers after it, truncating.
bool divides_before_sum(const torch::Tensor& tensor) { return tensor.is_floating_point(); }

// On the MPI thread. Open MPI's shared-memory all-reduce slows several-fold past ~8 MB (measured: 3.8 GB/s at
// 8 MB, 0.7 GB/s at 64 MB on one host), so a large tensor goes in pieces that stay fast; that also keeps each
// call's count within MPI's int. An average divides each piece right before (or after) MPI moves it, while it
// is in cache, where a division of the whole tensor first would be one more pass over memory on the caller's
// thread.
void all_reduce_in_pieces(torch::Tensor& buffer, MPI_Datatype type, ReduceOp op, int world_size, MPI_Comm comm) {
  const int64_t count = buffer.numel();
  const int64_t chunk = std::max<int64_t>(1, kAllreduceChunkBytes / buffer.element_size());
  const bool average = op == ReduceOp::Avg;
  const bool divide_first = divides_before_sum(buffer);
  torch::Tensor flat = buffer.view({-1});
  for (int64_t done = 0; done < count; done += chunk) {
    torch::Tensor piece = flat.narrow(0, done, std::min(chunk, count - done));
    if (average && divide_first) piece.div_(world_size);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, piece.data_ptr(), static_cast<int>(piece.numel()), type, to_mpi(op), comm),
              "MPI_Allreduce");
    if (average && !divide_first) piece.div_(world_size, "trunc");
  }
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

// MPI counts in int; the calls that are not split refuse more.
int mpi_count(int64_t count, const std::string& operation) {
  if (count > INT_MAX) {
    throw UnsupportedError(fmt::format("backend mpi does not support {} of more than {} elements (got {}); split the "
                                       "tensor", operation, INT_MAX, count));
  }
  return static_cast<int>(count);
}

}  // namespace

void check_started_by_mpi_launcher(const RankLayout& layout, const EnvLookup& env) {
  if (!layout.distributed() || layout.source == "slurm") return;
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"}) {
    if (env(variable)) return;
  }
  const std::string origin = layout.source == "env"        ? "RANK and WORLD_SIZE, as tandem run and torchrun set them"
                             : layout.source == "explicit" ? "the caller"
                                                           : layout.source;
  throw InvalidArgument(fmt::format(
      "`backend` mpi needs its {} ranks started by mpirun (or srun), but rank {} got its rank from {}; start the "
      "job with mpirun -np {} instead, or use `backend` gloo",
      layout.world_size, layout.rank, origin, layout.world_size));
}

MpiCommunicator::MpiCommunicator(const RankLayout& layout, std::chrono::milliseconds timeout, StorePtr store)
    : Communicator("mpi", std::move(store), layout.rank, layout.world_size, timeout,
                   Capabilities{/*average=*/true, /*reduce_scatter=*/true, /*tensor_device=*/torch::kCPU,
                                /*all_gather_into=*/true}) {
  check_started_by_mpi_launcher(layout);
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
        "`mpirun -np N` (or srun), not `tandem run`, or use `backend` gloo",
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

WorkPtr MpiCommunicator::start_all_reduce(torch::Tensor& tensor, ReduceOp op) {
  const std::string operation = "all_reduce(" + to_string(op) + ")";
  MPI_Datatype type = reduction_type(tensor, operation);
  torch::Tensor buffer = tensor.contiguous();
  return start_on_mpi_thread(runtime_, group_, timeout(), operation,
                             [tensor, buffer, type, op, world = world_size()](MPI_Comm comm) mutable {
                               all_reduce_in_pieces(buffer, type, op, world, comm);
                               if (!buffer.is_same(tensor)) tensor.copy_(buffer);
                             });
}

WorkPtr MpiCommunicator::start_broadcast(torch::Tensor& tensor, int root) {
  torch::Tensor buffer = tensor.contiguous();
  return start_on_mpi_thread(runtime_, group_, timeout(), "broadcast", [tensor, buffer, root](MPI_Comm comm) mutable {
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

WorkPtr MpiCommunicator::start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  const int bytes = mpi_count(input.nbytes(), "all_gather");
  mpi_count(input.nbytes() * world_size(), "all_gather");
  torch::Tensor send = input.contiguous();
  // MPI gathers into one buffer; the caller's outputs are separate tensors, filled from it afterwards.
  torch::Tensor gathered = torch::empty({world_size(), input.numel()}, input.options());
  return start_on_mpi_thread(runtime_, group_, timeout(), "all_gather",
                             [outputs, send, gathered, bytes](MPI_Comm comm) mutable {
                               check_mpi(MPI_Allgather(send.data_ptr(), bytes, MPI_BYTE, gathered.data_ptr(), bytes,
                                                       MPI_BYTE, comm),
                                         "MPI_Allgather");
                               for (size_t r = 0; r < outputs.size(); ++r) {
                                 outputs[r].copy_(gathered[static_cast<int64_t>(r)].view(outputs[r].sizes()));
                               }
                             });
}

WorkPtr MpiCommunicator::start_all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  const int bytes = mpi_count(input.nbytes(), "all_gather_into");
  mpi_count(input.nbytes() * world_size(), "all_gather_into");
  torch::Tensor send = input.contiguous();
  // The base hands a contiguous output, which MPI gathers into directly.
  return start_on_mpi_thread(runtime_, group_, timeout(), "all_gather_into", [output, send, bytes](MPI_Comm comm) {
    check_mpi(MPI_Allgather(send.data_ptr(), bytes, MPI_BYTE, output.data_ptr(), bytes, MPI_BYTE, comm),
              "MPI_Allgather");
  });
}

WorkPtr MpiCommunicator::start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const std::string operation = "reduce_scatter(" + to_string(op) + ")";
  MPI_Datatype type = reduction_type(input, operation);
  mpi_count(input.numel(), operation);
  const int count = mpi_count(output.numel(), operation);
  MPI_Op mpi_op = to_mpi(op);
  const bool average = op == ReduceOp::Avg;
  // The caller's input is read-only: an average that divides first divides a copy.
  torch::Tensor send = average && divides_before_sum(input) ? input.div(world_size()) : input.contiguous();
  const bool divide_result = average && !divides_before_sum(input);
  torch::Tensor receive = output.contiguous();
  return start_on_mpi_thread(
      runtime_, group_, timeout(), operation,
      [output, send, receive, type, count, mpi_op, divide_result, world = world_size()](MPI_Comm comm) mutable {
        check_mpi(MPI_Reduce_scatter_block(send.data_ptr(), receive.data_ptr(), count, type, mpi_op, comm),
                  "MPI_Reduce_scatter_block");
        if (divide_result) receive.div_(world, "trunc");
        if (!receive.is_same(output)) output.copy_(receive);
      });
}

WorkPtr MpiCommunicator::start_barrier() {
  return start_on_mpi_thread(runtime_, group_, timeout(), "barrier",
                             [](MPI_Comm comm) { check_mpi(MPI_Barrier(comm), "MPI_Barrier"); });
}

}  // namespace tandem::comm
