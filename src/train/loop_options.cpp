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

// What in-job recovery cannot carry across a change of membership: state that is not whole on every rank, ranks
// that stand at different batches, and a timeline whose window every rank closes together.
void check_recovery(const LoopOptions& options) {
  if (!options.in_job_recovery) return;
  if (options.strategy != Strategy::kDdp) {
    throw InvalidArgument(fmt::format("`in_job_recovery` needs `strategy` ddp: {}; train with ddp, or recover by a "
                                      "restart from the checkpoint",
                                      options.strategy == Strategy::kFsdp
                                          ? "fsdp's ranks each hold a shard that no other rank has"
                                          : "dp's replicas are threads of one process, with nobody to take over"));
  }
  if (options.uneven_inputs) {
    throw InvalidArgument("`in_job_recovery` cannot be combined with `uneven_inputs` (ranks stand at different batches "
                          "when one is lost)");
  }
  if (!options.timeline_path.empty()) {
    throw InvalidArgument("`in_job_recovery` cannot be combined with `timeline_path` (the timeline's window closes on "
                          "every rank of the first membership together)");
  }
}

}  // namespace

torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

void validate(const LoopOptions& options, int world_size, const ParallelStrategy& strategy) {
  check_ranges(options);
  check_recovery(options);
  strategy.validate(options, world_size);
}

void validate(const LoopOptions& options, int world_size) {
  validate(options, world_size, *make_parallel_strategy(options));
}

}  // namespace tandem::train
