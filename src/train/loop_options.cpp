#include "tandem/train/loop_options.h"

#include <fmt/format.h>
#include <torch/nn/functional/loss.h>

#include "tandem/ddp/named_comm_hook.h"
#include "tandem/train/parallel_strategy.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

void check_ranges(const LoopOptions& options) {
  if (options.epochs < 1) throw InvalidArgument(fmt::format("`epochs` must be at least 1, not {}", options.epochs));
  if (options.batch_size < 1) {
    throw InvalidArgument(fmt::format("`batch_size` must be at least 1, not {}", options.batch_size));
  }
  if (options.warmup_steps < 0) throw InvalidArgument("`warmup_steps` must not be negative");
  // A fraction of the rate: below 0 the schedule would turn the rate negative (gradient ascent), above 1 raise it.
  if (!(options.lrf >= 0 && options.lrf <= 1)) {
    throw InvalidArgument(
        fmt::format("`lrf` (the final rate as a fraction of the first) must be between 0 and 1, not {}", options.lrf));
  }
  if (!options.loss) throw InvalidArgument("`loss` is empty");
  if (options.accumulate_batches < 1) {
    throw InvalidArgument(fmt::format("`accumulate_batches` must be at least 1, not {}", options.accumulate_batches));
  }
  ddp::require_comm_hook_name(options.comm_hook);
}

}  // namespace

torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

void validate(const LoopOptions& options, int world_size, const ParallelStrategy& strategy) {
  check_ranges(options);
  strategy.validate(options, world_size);
}

void validate(const LoopOptions& options, int world_size) {
  validate(options, world_size, *make_parallel_strategy(options));
}

}  // namespace tandem::train
