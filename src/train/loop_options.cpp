#include "tandem/train/loop_options.h"

#include <fmt/format.h>
#include <torch/nn/functional/loss.h>

#include "tandem/ddp/named_comm_hook.h"
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

// Uneven inputs leave the ranks at different batches; what needs them in step is refused.
const char* uneven_inputs_conflict(const LoopOptions& options) {
  if (options.strategy == Strategy::kDataParallel) return "`strategy` dp (one process has no uneven ranks)";
  if (options.strategy == Strategy::kFsdp) {
    return "`strategy` fsdp (a rank out of data cannot answer the others' all-gathers)";
  }
  if (options.max_steps > 0) return "`max_steps` (ranks stop at different batches)";
  if (options.checkpoint_every > 0) return "`checkpoint_every` (ranks stand at different batches inside an epoch)";
  if (options.comm_hook == "powersgd") {
    return "`comm_hook` powersgd (a rank out of data still sends its error feedback, so the mean over the ranks "
           "that trained is not exact)";
  }
  return nullptr;
}

}  // namespace

torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

void validate(const LoopOptions& options, int world_size) {
  check_ranges(options);
  if (options.strategy == Strategy::kDataParallel && options.comm_hook != "average") {
    throw InvalidArgument(fmt::format("`comm_hook` {} shapes DDP's all-reduce between processes, and DataParallel "
                                      "reduces inside one process: drop `comm_hook`, or use `strategy` ddp",
                                      options.comm_hook));
  }
  if (options.strategy == Strategy::kFsdp && options.comm_hook != "average") {
    throw InvalidArgument(fmt::format("`comm_hook` {} shapes DDP's all-reduce, and `strategy` fsdp reduce-scatters "
                                      "its gradients itself: drop `comm_hook`, or use `strategy` ddp",
                                      options.comm_hook));
  }
  const fsdp::MixedPrecision& fsdp_precision = options.fsdp.mixed_precision;
  if (fsdp_precision.param_dtype != torch::kFloat32 || fsdp_precision.reduce_dtype) {
    throw InvalidArgument("fsdp.mixed_precision's dtypes follow `precision`: leave them float32 and set `precision` "
                          "bf16-mixed or 16-mixed, which gathers bfloat16 or float16 parameters and reduces in float32");
  }
  if (options.checkpoint_format == checkpoint::CheckpointFormat::kSharded && options.strategy != Strategy::kFsdp) {
    throw InvalidArgument("`checkpoint_format` sharded needs `strategy` fsdp: only fsdp's ranks hold shards to write; "
                          "drop `checkpoint_format`, or use `strategy` fsdp");
  }
  if (options.uneven_inputs) {
    if (const char* conflict = uneven_inputs_conflict(options)) {
      throw InvalidArgument(fmt::format("`uneven_inputs` cannot be combined with {}; drop one of them", conflict));
    }
  }
  if (options.strategy == Strategy::kDataParallel && world_size > 1) {
    throw InvalidArgument(fmt::format("`strategy` dp (DataParallel) trains in one process, but this is one of {}: "
                                      "use ddp under tandem run, or start a single process",
                                      world_size));
  }
}

}  // namespace tandem::train
