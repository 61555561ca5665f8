#include "apps/program/configuration_summary.h"

#include <fmt/format.h>

#include "tandem/data/crop_defaults.h"

namespace tandem::app {
using train::Strategy;

std::string describe_configuration(const TrainingProgramOptions& program, const data::DataFolder& data,
                                   int world_size, const std::string& checkpoint) {
  const train::LoopOptions& o = program.loop;
  const data::DataFolderOptions& folder = program.data;
  std::string out;
  const auto line = [&](const std::string& key, const std::string& value) { out += fmt::format("  {:<14} {}\n", key + ":", value); };
  line("data", folder.dir + (data.is_mnist ? " (MNIST files)" : " (image folder)"));
  line("model", fmt::format("{}, {} classes{}", program.model, folder.num_classes, program.sync_bn ? ", SyncBatchNorm" : ""));
  line("world size", std::to_string(world_size));
  line("device", o.device.str());
  if (o.strategy == Strategy::kFsdp) {
    line("strategy", fmt::format("fsdp, {} after forward", o.fsdp.reshard_after_forward ? "reshard" : "no reshard"));
  } else {
    line("strategy", o.strategy == Strategy::kDdp ? "ddp" : fmt::format("dp, {} replicas", o.dp_devices.size()));
  }
  line("precision", amp::to_string(o.precision) + (amp::uses_loss_scaling(o.precision) ? " (loss scaling)" : ""));
  line("epochs", std::to_string(o.epochs));
  // The products in doubles: each flag may be as large as its type, and their product no longer fits.
  const double batch_in_all = static_cast<double>(o.batch_size) * world_size;
  line("batch size", fmt::format("{} per process, {} in all", o.batch_size, batch_in_all));
  if (o.accumulate_batches > 1) {
    line("accumulate", fmt::format("{} batches per step ({} samples in all)", o.accumulate_batches,
                                   static_cast<double>(o.accumulate_batches) * batch_in_all));
  }
  if (o.comm_hook == "powersgd") {
    line("comm hook", fmt::format("powersgd (rank {}, from step {})", o.powersgd.matrix_approximation_rank,
                                  o.powersgd.start_powersgd_iter + 1));
  } else {
    line("comm hook", o.comm_hook);
  }
  // A run continued on another layout rescales by its global batch over its first batch size; the loop says so.
  line("lr", fmt::format("{} x {} rank{} = {} (cosine to x{})", program.lr, world_size, world_size == 1 ? "" : "s",
                         program.lr * world_size, o.lrf));
  line("momentum", fmt::format("{}", program.momentum));
  line("weight decay", fmt::format("{}", program.weight_decay));
  line("zero", program.zero ? fmt::format("SGD state sharded over {} ranks", world_size) : "no");
  line("steps", o.max_steps > 0 ? std::to_string(o.max_steps) : "all");
  line("seed", std::to_string(o.seed));
  line("shuffle", o.shuffle ? "yes" : "no");
  if (data.is_mnist) {
    line("normalize", fmt::format("mean {} std {}", folder.normalization->mean, folder.normalization->std));
  } else {
    line("image size", std::to_string(folder.image_size));
    line("val split", fmt::format("{}", *folder.val_split));
    line("crop scale", fmt::format("train: random area [{:.3g}, 1]; val: resize to {:.4g} x size, center crop",
                                   folder.min_crop_scale, data::default_val_resize_ratio(folder.image_size)));
    line("bad images", folder.skip_bad_images ? "skip and count" : "stop with an error");
  }
  line("threads", std::to_string(torch::get_num_threads()) + " per process");
  line("init weights", program.init_weights.empty() ? "none (rank 0's seeded init, broadcast)" : program.init_weights);
  if (!program.init_weights.empty()) line("strict", program.strict ? "yes" : "no");
  line("freeze layers", program.freeze_layers ? "yes" : "no");
  line("save weights", program.save_weights.empty() ? "no" : program.save_weights);
  line("run dir", o.run_dir);
  // A run dir that holds a checkpoint is continued with or without --resume: the line says what happens.
  line("resume", checkpoint.empty() ? "no (a new run)" : "from " + checkpoint);
  line("uneven inputs", o.uneven_inputs ? "yes (every sample once; ranks out of batches shadow the others)" : "no");
  line("check replicas", o.ddp.check_replicas_every > 0 ? fmt::format("every {} steps", o.ddp.check_replicas_every) : "no");
  line("checkpoints", !o.checkpoint ? "none"
                      : fmt::format("{}at epoch ends{}; the newest {} kept",
                                    o.checkpoint_format == checkpoint::CheckpointFormat::kSharded ? "sharded, " : "",
                                    o.checkpoint_every > 0 ? fmt::format(" and every {} steps", o.checkpoint_every) : "",
                                    o.keep_checkpoints > 0 ? std::to_string(o.keep_checkpoints) : "all"));
  line("records", fmt::format("metrics.jsonl, steps.jsonl{}{}", o.tensorboard ? ", TensorBoard events" : "",
                              o.report ? ", report.html at the end" : ""));
  line("timeline", o.timeline_path.empty() ? "no"
                   : fmt::format("steps {}-{} to {}", o.timeline_steps.first, o.timeline_steps.last, o.timeline_path));
  return out;
}

}  // namespace tandem::app
