#include "tandem/ddp/powersgd_hook.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::ddp {
namespace {

// The seed of the next draw of initial Qs, taken as PyTorch's hook takes it, numpy's
// RandomState(random_seed).randint(10**9): the low 30 bits of a Mersenne Twister seeded as std::mt19937 seeds,
// drawn again while above the bound. The same seeds make LibTorch's CPU generator draw Python's values.
uint32_t next_q_seed(std::mt19937& engine) {
  constexpr uint32_t kLargest = 999'999'999;
  constexpr uint32_t kMask = (uint32_t{1} << 30) - 1;
  uint32_t value = 0;
  do {
    value = static_cast<uint32_t>(engine()) & kMask;
  } while (value > kLargest);
  return value;
}

// Makes the columns of each (n x r) matrix of `matrices` (batch, n, r) orthonormal, in place, by PyTorch's
// choice and in its operation order: QR above rank 2 (LAPACK has no 16-bit QR), Gram-Schmidt otherwise.
void orthogonalize(const torch::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  const bool sixteen_bit = matrices.scalar_type() == torch::kHalf || matrices.scalar_type() == torch::kBFloat16;
  if (columns > 2 && !sixteen_bit) {
    matrices.copy_(std::get<0>(torch::linalg_qr(matrices)));
    return;
  }
  for (int64_t i = 0; i < columns; ++i) {
    torch::Tensor column = matrices.narrow(2, i, 1);
    torch::Tensor norm = column.norm(2, {1}, /*keepdim=*/true);
    column.div_(epsilon == 0 ? norm : norm + epsilon);
    if (i + 1 < columns) {
      torch::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(torch::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options) : options_(options), seeds_(options.random_seed) {}

  // Every option: DDP's construction check compares the hook's name across ranks.
  std::string name() const override {
    return fmt::format("powersgd(rank={},start={},min_compression_rate={},error_feedback={},warm_start={},"
                       "epsilon={},seed={})",
                       options_.matrix_approximation_rank, options_.start_powersgd_iter,
                       options_.min_compression_rate, options_.use_error_feedback, options_.warm_start,
                       options_.orthogonalization_epsilon, options_.random_seed);
  }

  comm::WorkPtr launch(comm::Communicator& communicator, const GradBucket& bucket) override {
    const bool last = bucket.index + 1 == bucket.bucket_count;
    if (iteration_.load() < options_.start_powersgd_iter) {
      if (last) ++iteration_;
      torch::Tensor buffer = bucket.buffer;
      return all_reduce(communicator, buffer, comm::ReduceOp::Avg);
    }
    BucketState& state = state_for(bucket);
    if (options_.use_error_feedback) {
      state.payload.add_(state.error);
      // Holds this iteration's corrected input until the decompression subtracts what the ranks agreed on.
      state.error.copy_(state.payload);
    }
    if (options_.warm_start && state.has_q) {
      for (auto& matrix : state.compressed) orthogonalize(matrix.q, options_.orthogonalization_epsilon);
    } else {
      draw_initial_qs(state);
    }
    for (auto& matrix : state.compressed) torch::bmm_out(matrix.p, matrix.m, matrix.q);
    int64_t offset = 0;
    for (const auto& tensor : state.uncompressed) {
      state.plain.narrow(0, offset, tensor.numel()).copy_(tensor);
      offset += tensor.numel();
    }
    // Two collectives in this order on every rank; neither depends on the other.
    comm::WorkPtr plain_work = state.plain.numel() > 0 ? all_reduce(communicator, state.plain, comm::ReduceOp::Sum)
                                                       : nullptr;
    comm::WorkPtr p_work =
        state.p_memory.numel() > 0 ? all_reduce(communicator, state.p_memory, comm::ReduceOp::Sum) : nullptr;
    comm::WorkPtr first = p_work ? p_work : plain_work;
    TANDEM_CHECK(first, "bucket ", bucket.index, " holds no elements");
    return then(first, [this, &communicator, &state, plain_work, p_work, last] {
      if (plain_work && p_work) plain_work->wait();
      decompress(communicator, state);
      if (last) ++iteration_;
    });
  }

 private:
  struct Matrix {
    torch::Tensor m;  // the gradient as (1, n, m), a view into the bucket
    torch::Tensor p;  // (1, n, r), a view into p_memory
    torch::Tensor q;  // (1, m, r), a view into q_memory
  };
  struct BucketState {
    const void* buffer = nullptr;  // the bucket this state belongs to
    torch::Tensor payload;         // the gradients: the whole buffer
    // Ordered as PyTorch draws their initial Qs: grouped by shape, groups in order of first appearance.
    std::vector<Matrix> compressed;
    std::vector<torch::Tensor> uncompressed;  // flat views of the gradients not worth compressing
    torch::Tensor plain;                      // the uncompressed ones side by side, for one all-reduce
    torch::Tensor p_memory, q_memory;
    torch::Tensor error;  // error feedback, over the payload
    bool has_q = false;   // q_memory holds the last iteration's averaged Q
  };

  // The plan for a bucket, made at its first compressed iteration. With error feedback or warm start that is
  // after DDP's one bucket rebuild (start_powersgd_iter >= 2); without them compression may start before it, and
  // the rebuilt buckets (new buffers for the same indices, from the same model) get new plans, losing nothing.
  BucketState& state_for(const GradBucket& bucket) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buckets_.empty()) {
      model_ = bucket.model;
    } else if (bucket.model != model_) {
      throw InvalidArgument(fmt::format(
          "the PowerSGD hook met bucket {} of a second model: a PowerSGD hook keeps the state of one model's "
          "buckets; give each DistributedDataParallel its own make_powersgd_hook()",
          bucket.index));
    }
    auto found = buckets_.find(bucket.index);
    if (found != buckets_.end()) {
      if (found->second.buffer == bucket.buffer.data_ptr()) return found->second;
      // The model rebuilt its buckets; plans of indices it no longer has would only hold the old buffers.
      buckets_.erase(buckets_.lower_bound(bucket.bucket_count), buckets_.end());
      buckets_.erase(bucket.index);
    }
    if (bucket.gradients.empty()) {
      throw InvalidArgument("the PowerSGD hook needs GradBucket::gradients, the per-parameter views into the buffer");
    }
    BucketState state;
    state.buffer = bucket.buffer.data_ptr();
    const torch::Tensor& buffer = bucket.buffer;
    const auto element_size = static_cast<int64_t>(buffer.element_size());
    int64_t offset = 0;
    std::vector<std::pair<std::vector<int64_t>, std::vector<torch::Tensor>>> by_shape;
    for (const auto& gradient : bucket.gradients) {
      TANDEM_CHECK(gradient.is_contiguous() &&
                       gradient.data_ptr() == static_cast<char*>(buffer.data_ptr()) + offset * element_size,
                   "GradBucket::gradients must be contiguous views lying in order from the start of the buffer; "
                   "gradient at element ", offset, " is not");
      offset += gradient.numel();
      const int64_t rows = gradient.dim() > 0 ? gradient.size(0) : 1;
      const int64_t columns = rows > 0 ? gradient.numel() / rows : 0;
      const int64_t rank = std::min({rows, columns, options_.matrix_approximation_rank});
      const double compressed_size = static_cast<double>((rows + columns) * rank);
      if (compressed_size * options_.min_compression_rate < static_cast<double>(rows * columns)) {
        const std::vector<int64_t> shape{rows, columns};
        auto group = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& g) { return g.first == shape; });
        if (group == by_shape.end()) group = by_shape.insert(by_shape.end(), {shape, {}});
        group->second.push_back(gradient.view({1, rows, columns}));
      } else {
        state.uncompressed.push_back(gradient.view({-1}));
      }
    }
    // The reducer keeps its bookkeeping out of any hook but a plain average's (CommHook::is_plain_average).
    TANDEM_CHECK(offset == buffer.numel(), "the bucket's gradients hold ", offset, " elements, its buffer ",
                 buffer.numel());
    state.payload = buffer;

    int64_t p_numel = 0, q_numel = 0;
    for (const auto& [shape, matrices] : by_shape) {
      const int64_t rank = std::min({shape[0], shape[1], options_.matrix_approximation_rank});
      p_numel += shape[0] * rank * static_cast<int64_t>(matrices.size());
      q_numel += shape[1] * rank * static_cast<int64_t>(matrices.size());
    }
    state.p_memory = torch::empty({p_numel}, buffer.options());
    state.q_memory = torch::empty({q_numel}, buffer.options());
    int64_t p_offset = 0, q_offset = 0;
    for (const auto& [shape, matrices] : by_shape) {
      const int64_t rank = std::min({shape[0], shape[1], options_.matrix_approximation_rank});
      for (const auto& matrix : matrices) {
        state.compressed.push_back({matrix, state.p_memory.narrow(0, p_offset, shape[0] * rank).view({1, shape[0], rank}),
                                    state.q_memory.narrow(0, q_offset, shape[1] * rank).view({1, shape[1], rank})});
        p_offset += shape[0] * rank;
        q_offset += shape[1] * rank;
      }
    }
    int64_t plain_numel = 0;
    for (const auto& tensor : state.uncompressed) plain_numel += tensor.numel();
    state.plain = torch::empty({plain_numel}, buffer.options());
    if (options_.use_error_feedback) state.error = torch::zeros({offset}, buffer.options());
    return buckets_.emplace(bucket.index, std::move(state)).first->second;
  }

  // One seed per draw, taken even for a bucket with nothing to compress, as PyTorch takes it.
  void draw_initial_qs(BucketState& state) {
    uint32_t seed = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seed = next_q_seed(seeds_);
    }
    torch::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (auto& matrix : state.compressed) {
      matrix.q.copy_(torch::randn(matrix.q.sizes(), generator, torch::TensorOptions().dtype(matrix.q.scalar_type())));
      orthogonalize(matrix.q, options_.orthogonalization_epsilon);
    }
  }

  // After the plain and the P all-reduce: average the plain part, finish the power iteration with the Q
  // all-reduce, and write P Q^T into the bucket.
  void decompress(comm::Communicator& communicator, BucketState& state) {
    const int world_size = communicator.world_size();
    state.plain.div_(world_size);
    int64_t offset = 0;
    for (auto& tensor : state.uncompressed) {
      tensor.copy_(state.plain.narrow(0, offset, tensor.numel()));
      offset += tensor.numel();
    }
    if (!state.compressed.empty()) {
      for (auto& matrix : state.compressed) orthogonalize(matrix.p, options_.orthogonalization_epsilon);
      for (auto& matrix : state.compressed) torch::bmm_out(matrix.q, matrix.m.transpose(1, 2), matrix.p);
      all_reduce(communicator, state.q_memory, comm::ReduceOp::Sum)->wait();
      state.q_memory.div_(world_size);
      for (auto& matrix : state.compressed) torch::bmm_out(matrix.m, matrix.p, matrix.q.transpose(1, 2));
    }
    if (options_.use_error_feedback) state.error.sub_(state.payload);
    state.has_q = true;
  }

  PowerSgdOptions options_;
  std::atomic<int64_t> iteration_{0};  // completed iterations: counted at the last bucket
  std::mutex mutex_;                   // guards seeds_, model_ and buckets_
  std::mt19937 seeds_;
  const void* model_ = nullptr;            // GradBucket::model of the buckets this hook serves
  std::map<size_t, BucketState> buckets_;  // by bucket index; std::map keeps references stable
};

}  // namespace

CommHookPtr make_powersgd_hook(PowerSgdOptions options) {
  if (options.matrix_approximation_rank < 1) {
    throw InvalidArgument(fmt::format("PowerSGD: matrix_approximation_rank must be at least 1, got {}",
                                      options.matrix_approximation_rank));
  }
  if (options.start_powersgd_iter < 0) {
    throw InvalidArgument(fmt::format("PowerSGD: start_powersgd_iter must be >= 0, got {}", options.start_powersgd_iter));
  }
  if ((options.use_error_feedback || options.warm_start) && options.start_powersgd_iter < 2) {
    throw InvalidArgument(fmt::format(
        "PowerSGD: start_powersgd_iter must be at least 2 with error feedback or warm start (got {}), as in PyTorch: "
        "their state must not be made before DDP's buckets are final",
        options.start_powersgd_iter));
  }
  if (options.min_compression_rate < 0 || options.orthogonalization_epsilon < 0) {
    throw InvalidArgument(fmt::format("PowerSGD: min_compression_rate ({}) and orthogonalization_epsilon ({}) must be >= 0",
                                      options.min_compression_rate, options.orthogonalization_epsilon));
  }
  return std::make_shared<PowerSgdHook>(options);
}

}  // namespace tandem::ddp
