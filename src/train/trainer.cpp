#include "tandem/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "tandem/comm/rank_agreement.h"
#include "tandem/data/crop_defaults.h"
#include "tandem/data/data_folder.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/safetensors.h"
#include "tandem/util/log.h"
#include "tandem/util/output_path.h"

namespace tandem::train {
namespace {

data::DataFolderOptions data_folder_options(const TrainOptions& o) {
  data::DataFolderOptions folder;
  folder.dir = o.data_dir;
  folder.normalization = o.normalization;
  folder.num_classes = o.num_classes;
  folder.image_size = o.image_size;
  folder.val_split = o.val_split;
  folder.min_crop_scale = o.min_crop_scale;
  folder.skip_bad_images = o.skip_bad_images;
  folder.seed = o.seed;
  return folder;
}

// Opens --data and resolves the options that depend on it (num_classes, image_size, min_crop_scale) in place, so
// that every rank and describe() see the same values.
data::DataFolder open_data(TrainOptions& o) {
  data::DataFolderOptions folder = data_folder_options(o);
  data::DataFolder data = data::open_data_folder(folder);
  o.image_size = folder.image_size;
  o.min_crop_scale = folder.min_crop_scale;
  if (o.num_classes == 0) o.num_classes = data.num_classes;
  if (o.num_classes < data.num_classes) {
    throw InvalidArgument(fmt::format("--num-classes {} is fewer than the {} classes in {}", o.num_classes,
                                      data.num_classes, o.data_dir));
  }
  return data;
}

// --model built for the data, seeded so that every rank starts alike (DDP then makes rank 0's weights everyone's),
// with --init weights, --sync-bn and --freeze-layers applied.
nn::Model build_model(const TrainOptions& o, const data::DataFolder& data, const comm::CommunicatorPtr& communicator) {
  comm::Communicator* group = communicator.get();
  const bool is_main = !group || group->rank() == 0;
  torch::manual_seed(o.seed);
  nn::Model model;
  comm::run_on_all_ranks(group, "to build the model", [&] {
    model = nn::make_model(o.model, nn::ModelOptions{o.num_classes, data.in_channels, data.image_size});
  });
  torch::nn::Module& module = *model.module.ptr();
  comm::run_on_all_ranks(group, "to load --init weights", [&] {
    if (o.init_weights.empty()) return;
    LoadReport report = load_weights(module, o.init_weights, o.strict);
    if (!is_main) return;
    log::write("", fmt::format("loaded {} tensors from {}", report.loaded.size(), o.init_weights));
    for (const auto& s : report.skipped) log::warn("skipped {}", s);
    for (const auto& m : report.missing) log::warn("not in {}: {} (keeps its initial value)", o.init_weights, m);
  });
  // SyncBatchNorm before DDP and the optimizer (as PyTorch requires): the swap keeps the parameter tensors, and
  // DDP must see the model it will run.
  if (o.sync_bn) {
    nn::convert_sync_batchnorm(model.module.ptr(), communicator);
    // Every rank holds the same model, so every rank refuses alike.
    if (nn::count_sync_batchnorm(module) == 0) {
      throw InvalidArgument(fmt::format("--sync-bn: model '{}' has no BatchNorm layers to synchronise; drop --sync-bn, "
                                        "or train a model with BatchNorm (cnn-bn, resnet18, resnet34)",
                                        o.model));
    }
  }
  if (o.freeze_layers) {
    auto trainable = nn::freeze_all_but_head(model);
    log::main_info("--freeze-layers: training {} tensors of the classifier head", trainable.size());
  }
  return model;
}

// Every file and folder the run writes into (rank 0 writes them all), checked before the data is loaded: a path
// that fails at the end would throw the whole training away.
void check_output_paths(const TrainOptions& o) {
  if (!o.save_weights.empty()) require_writable_file("--save-weights", o.save_weights);
  if (!o.timeline_path.empty()) require_writable_file("--timeline", o.timeline_path);
  // Without --run-dir, rank 0 makes (or with --resume finds) runs/<timestamp> in the working folder.
  if (o.run_dir.empty()) {
    require_creatable_folder("the runs folder (--run-dir to choose another)", "runs");
  } else {
    require_creatable_folder("--run-dir", o.run_dir);
    if (o.report && std::filesystem::is_directory(o.run_dir)) {
      require_writable_file("the report", o.run_dir + "/report.html");
    }
  }
}

LoopOptions loop_options(const TrainOptions& o) {
  LoopOptions loop;
  loop.epochs = o.epochs;
  loop.batch_size = o.batch_size;
  loop.max_steps = o.max_steps;
  loop.seed = o.seed;
  loop.shuffle = o.shuffle;
  loop.lrf = o.lrf;
  loop.device = o.device;
  loop.prefetch_batches = o.prefetch_batches;
  loop.run_dir = o.run_dir;
  loop.resume = o.resume;
  loop.checkpoint = o.checkpoint;
  loop.checkpoint_every = o.checkpoint_every;
  loop.keep_checkpoints = o.keep_checkpoints;
  loop.check_replicas_every = o.check_replicas_every;
  loop.uneven_inputs = o.uneven;
  loop.accumulate_batches = o.accumulate_batches;
  loop.comm_hook = o.comm_hook;
  loop.powersgd = o.powersgd;
  loop.progress = o.progress;
  loop.precision = o.precision;
  loop.strategy = o.strategy;
  loop.tensorboard = o.tensorboard;
  loop.report = o.report;
  loop.timeline_path = o.timeline_path;
  loop.timeline_steps = o.timeline_steps;
  if (o.strategy == Strategy::kDataParallel) loop.dp_devices = dp::replica_devices(o.device, o.dp_replicas);
  return loop;
}

}  // namespace

std::string describe(const TrainOptions& o, int world_size) {
  const bool mnist = data::has_mnist_files(o.data_dir);
  std::string out;
  const auto line = [&](const std::string& key, const std::string& value) { out += fmt::format("  {:<14} {}\n", key + ":", value); };
  line("data", o.data_dir + (mnist ? " (MNIST files)" : " (image folder)"));
  line("model", fmt::format("{}, {} classes{}", o.model, o.num_classes, o.sync_bn ? ", SyncBatchNorm" : ""));
  line("world size", std::to_string(world_size));
  line("device", o.device.str());
  line("strategy", o.strategy == Strategy::kDdp ? "ddp" : fmt::format("dp, {} replicas", dp::replica_devices(o.device, o.dp_replicas).size()));
  line("precision", amp::to_string(o.precision) + (amp::uses_loss_scaling(o.precision) ? " (loss scaling)" : ""));
  line("epochs", std::to_string(o.epochs));
  line("batch size", fmt::format("{} per process, {} in all", o.batch_size, o.batch_size * world_size));
  if (o.accumulate_batches > 1) {
    line("accumulate", fmt::format("{} batches per step ({} samples in all)", o.accumulate_batches,
                                   o.accumulate_batches * o.batch_size * world_size));
  }
  if (o.comm_hook == "powersgd") {
    line("comm hook", fmt::format("powersgd (rank {}, from step {})", o.powersgd.matrix_approximation_rank,
                                  o.powersgd.start_powersgd_iter + 1));
  } else {
    line("comm hook", o.comm_hook);
  }
  line("lr", fmt::format("{} x {} ranks = {} (cosine to x{})", o.lr, world_size, o.lr * world_size, o.lrf));
  line("momentum", fmt::format("{}", o.momentum));
  line("weight decay", fmt::format("{}", o.weight_decay));
  line("zero", o.zero ? fmt::format("SGD state sharded over {} ranks", world_size) : "no");
  line("steps", o.max_steps > 0 ? std::to_string(o.max_steps) : "all");
  line("seed", std::to_string(o.seed));
  line("shuffle", o.shuffle ? "yes" : "no");
  if (mnist) {
    const data::Normalization norm = o.normalization ? *o.normalization : data::guess_normalization(o.data_dir);
    line("normalize", fmt::format("mean {} std {}", norm.mean, norm.std));
  } else {
    line("image size", std::to_string(o.image_size));
    line("val split", fmt::format("{}", o.val_split));
    line("crop scale", fmt::format("train: random area [{:.3g}, 1]; val: resize to {:.4g} x size, center crop",
                                   o.min_crop_scale, data::default_val_resize_ratio(o.image_size)));
    line("bad images", o.skip_bad_images ? "skip and count" : "stop with an error");
  }
  line("threads", std::to_string(torch::get_num_threads()) + " per process");
  line("init weights", o.init_weights.empty() ? "none (rank 0's seeded init, broadcast)" : o.init_weights);
  if (!o.init_weights.empty()) line("strict", o.strict ? "yes" : "no");
  line("freeze layers", o.freeze_layers ? "yes" : "no");
  line("save weights", o.save_weights.empty() ? "no" : o.save_weights);
  line("run dir", o.run_dir);
  line("resume", o.resume ? "yes" : "no");
  line("uneven inputs", o.uneven ? "yes (every sample once; ranks out of batches shadow the others)" : "no");
  line("check replicas", o.check_replicas_every > 0 ? fmt::format("every {} steps", o.check_replicas_every) : "no");
  line("checkpoints", !o.checkpoint ? "none"
                      : fmt::format("at epoch ends{}; the newest {} kept",
                                    o.checkpoint_every > 0 ? fmt::format(" and every {} steps", o.checkpoint_every) : "",
                                    o.keep_checkpoints > 0 ? std::to_string(o.keep_checkpoints) : "all"));
  line("records", fmt::format("metrics.jsonl, steps.jsonl{}{}", o.tensorboard ? ", TensorBoard events" : "",
                              o.report ? ", report.html at the end" : ""));
  line("timeline", o.timeline_path.empty() ? "no"
                   : fmt::format("steps {}-{} to {}", o.timeline_steps.first, o.timeline_steps.last, o.timeline_path));
  return out;
}

TrainResult train(const TrainOptions& given, const comm::CommunicatorPtr& communicator) {
  comm::Communicator* group = communicator.get();
  const int world = group ? group->world_size() : 1;
  const bool is_main = !group || group->rank() == 0;
  TrainOptions options = given;
  // Epochs and batch size are the loop's to check; the rate is ours, since the loop takes the optimizer's.
  if (options.lr <= 0) throw InvalidArgument("--lr must be positive");
  if (options.sync_bn && options.strategy == Strategy::kDataParallel) {
    throw InvalidArgument("--sync-bn needs --strategy ddp: DataParallel's replicas are threads of one process, "
                          "with no process group to share statistics over");
  }
  if (options.zero && options.strategy == Strategy::kDataParallel) {
    throw InvalidArgument("--zero needs --strategy ddp: it shards the optimizer state among processes, and "
                          "DataParallel's replicas are threads of one");
  }

  comm::run_on_all_ranks(group, "to check the output paths", [&] {
    if (is_main) check_output_paths(options);
  });
  data::DataFolder data;
  comm::run_on_all_ranks(group, "to load the data set", [&] { data = open_data(options); });
  nn::Model model = build_model(options, data, communicator);
  std::vector<torch::Tensor> trainable;
  for (auto& p : model.module.ptr()->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  // The per-rank --lr: the loop multiplies it by the world size, as the seeds do.
  const auto sgd = torch::optim::SGDOptions(options.lr).momentum(options.momentum).weight_decay(options.weight_decay);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (options.zero) {
    optimizer = std::make_unique<optim::ZeroRedundancyOptimizer>(
        trainable, optim::make_optimizer<torch::optim::SGD>(sgd), communicator);
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(trainable, sgd);
  }

  Loop loop(loop_options(options), communicator);
  LoopCallbacks& callbacks = loop.callbacks();
  callbacks.on_run_start = [&](const std::string& run_dir) {
    options.run_dir = run_dir;
    if (!is_main) return;
    log::write("", "training configuration:\n" + describe(options, world));
    if (!data.classes.empty()) data::write_class_list(data.classes, run_dir + "/class_indices.json");
  };
  if (data.image_train) {
    callbacks.on_epoch_start = [&](int epoch) { data.image_train->set_epoch(epoch); };
    callbacks.on_epoch_end = [&](const EpochMetrics&) {
      if (data.image_train->skipped_images() == 0) return;
      log::warn("skipped {} unreadable training images so far (--skip-bad-images)", data.image_train->skipped_images());
    };
  }
  TrainResult result = loop.fit(model.module, *optimizer, data.train, data.eval);

  comm::run_on_all_ranks(group, "to save --save-weights", [&] {
    if (is_main && !options.save_weights.empty()) {
      save_weights(*model.module.ptr(), options.save_weights,
                   {{"model", options.model}, {"step", std::to_string(result.steps)}});
      log::write("", "wrote weights to " + options.save_weights);
    }
  });
  return result;
}

}  // namespace tandem::train
