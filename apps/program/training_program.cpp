#include "apps/program/training_program.h"

#include "apps/program/configuration_summary.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>

#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/optimizer_import.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/data/data_folder.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/run_directory.h"
#include "tandem/util/log.h"
#include "tandem/util/needs.h"
#include "tandem/util/output_path.h"

namespace tandem::app {
using train::Strategy;

namespace {

// Whether `model_name` has BatchNorm layers: the registry does not say, so one is built, which takes a moment
// for a ResNet. Small RGB images are a shape every registered model takes (the ResNets take RGB only, the CNNs
// any channels from 10x10 pixels).
bool has_batch_norm(const std::string& model_name) {
  const nn::Model model =
      nn::make_model(model_name, nn::ModelOptions{/*num_classes=*/10, /*in_channels=*/3, /*image_size=*/32});
  return nn::has_batch_norm(*model.module.ptr());
}

// The registered models with BatchNorm layers (`with` true) or without them, as a list for a message.
std::string models_by_batch_norm(bool with) {
  std::string names;
  for (const auto& [name, description] : nn::registered_models()) {
    if (has_batch_norm(name) == with) names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

// A BatchNorm layer in training mode normalises by its batch's own statistics, which one sample cannot give: at
// 1x1 pixels LibTorch refuses it ("Expected more than 1 value per channel"), mid-run and on some ranks only (the
// last batch of a rank under --uneven), and at larger sizes it trains on each image's statistics alone. So a
// batch of one sample at a BatchNorm is refused before any rank trains, wherever the settings make one: one sample
// per rank, a DataParallel replica's share of the batch, or a rank's whole share of the data under --uneven. The
// training set's last partial batch is dropped (drop_last), and under --uneven a last batch of one sample joins the
// batch before it, so no other batch of one is made. With --sync-bn on two or more ranks the statistics cover
// every rank's batch, and one sample per rank trains.
void require_batch_norm_batches(const TrainingProgramOptions& o, const nn::Model& model, int world_size,
                                int64_t train_samples) {
  if (!nn::has_batch_norm(*model.module.ptr()) || (o.sync_bn && world_size > 1)) return;
  const std::string remedy = fmt::format("or train a model without BatchNorm ({})", models_by_batch_norm(false));
  const std::string layers =
      fmt::format("the BatchNorm layers of --model {}, which need more than one in training mode", o.model);
  if (o.loop.batch_size == 1) {
    throw InvalidArgument(fmt::format("--batch-size 1 gives one sample per rank to {}; use --batch-size 2 or more{}, {}",
                                      layers, o.sync_bn ? " (--sync-bn shares statistics only among 2 or more ranks)" : "",
                                      remedy));
  }
  if (o.loop.strategy == Strategy::kDataParallel) {
    const auto replicas = static_cast<int64_t>(o.loop.dp_devices.size());
    if (o.loop.batch_size < 2 * replicas) {
      throw InvalidArgument(fmt::format("--batch-size {} split over --strategy dp's {} replicas gives a replica one "
                                        "sample for {}; use --batch-size {} or more, fewer --dp-replicas, {}",
                                        o.loop.batch_size, replicas, layers, 2 * replicas, remedy));
    }
  }
  if (o.loop.uneven_inputs && train_samples / world_size == 1) {
    throw InvalidArgument(fmt::format("--uneven shares {} training samples over {} ranks, which leaves a rank one "
                                      "sample for {}; use fewer ranks, drop --uneven, {}",
                                      train_samples, world_size, layers, remedy));
  }
}

// --model built for the data, seeded so that every rank starts alike (DDP then makes rank 0's weights everyone's),
// with --init weights, --sync-bn and --freeze-layers applied, and refused where its BatchNorm layers would see
// batches of one.
nn::Model build_model(const TrainingProgramOptions& o, const data::DataFolder& data, const comm::CommunicatorPtr& communicator) {
  comm::Communicator* group = communicator.get();
  const bool is_main = !group || group->rank() == 0;
  torch::manual_seed(o.loop.seed);
  nn::Model model;
  comm::run_on_all_ranks(group, "to build the model", [&] {
    model = nn::make_model(o.model, nn::ModelOptions{o.data.num_classes, data.in_channels, data.image_size});
    if (o.init_weights.empty()) return;
    checkpoint::LoadReport report = checkpoint::load_weights(
        *model.module.ptr(), checkpoint::read_model_weights(o.init_weights), o.init_weights, o.strict);
    if (!is_main) return;
    log::write("", fmt::format("loaded {} tensors from {}", report.loaded.size(), o.init_weights));
    for (const auto& s : report.skipped) log::warn("skipped {}", s);
    for (const auto& m : report.missing) log::warn("not in {}: {} (keeps its initial value)", o.init_weights, m);
  });
  // SyncBatchNorm before DDP and the optimizer (as PyTorch requires): the swap keeps the parameter tensors, and
  // DDP must see the model it will run. Under in-job recovery the layers take the default group's communicator
  // at each forward, which is the current membership's.
  if (o.sync_bn) {
    nn::convert_sync_batchnorm(model.module.ptr(), o.loop.in_job_recovery ? nullptr : communicator);
  }
  if (o.freeze_layers) {
    auto trainable = nn::freeze_all_but_head(model);
    log::main_info("--freeze-layers: training {} tensors of the classifier head", trainable.size());
  }
  require_batch_norm_batches(o, model, group ? group->world_size() : 1, data.train->size());
  return model;
}

// --strategy fsdp's refusals: the program's own, then the loop's (which the loop would only make after the
// rendezvous; none depends on the world size).
void validate_fsdp(const TrainingProgramOptions& o) {
  if (o.zero) {
    throw InvalidArgument("--zero cannot be combined with --strategy fsdp, which shards the optimizer state itself "
                          "(with the parameters and gradients): drop --zero");
  }
  if (o.sync_bn) {
    throw InvalidArgument("--sync-bn cannot be combined with --strategy fsdp, which broadcasts rank 0's BatchNorm "
                          "statistics at each forward instead: drop --sync-bn, or use --strategy ddp");
  }
  if (o.freeze_layers) {
    throw InvalidArgument("--freeze-layers cannot be combined with --strategy fsdp, which shards trainable "
                          "parameters only: drop --freeze-layers, or use --strategy ddp");
  }
  train::validate(o.loop, 1);
}

}  // namespace

// What in-job recovery cannot carry over to a new membership, besides the loop's own refusals: a sharded
// optimizer's state.
// --init-optimizer reads a PyTorch distributed checkpoint's optimizer state into a plain optimizer.
void validate_init_optimizer(const TrainingProgramOptions& o) {
  if (o.init_weights.empty() || !checkpoint::is_distributed_checkpoint(o.init_weights)) {
    throw InvalidArgument("--init-optimizer continues the optimizer state of a PyTorch distributed checkpoint (a "
                          "folder with .metadata) that --init names; a tandem run dir continues its own optimizer "
                          "state by itself (--run-dir, --resume): drop --init-optimizer, or give --init such a folder");
  }
  if (o.zero) {
    throw InvalidArgument("--init-optimizer cannot be combined with --zero yet (its state would go to one optimizer "
                          "over every parameter): drop one of them");
  }
}

void validate_recovery(const TrainingProgramOptions& o) {
  if (o.zero) {
    throw InvalidArgument("--zero cannot be combined with tandem run's --recovery in-job: a lost rank's share of the "
                          "optimizer state is on no other rank; drop --zero, or recover by --recovery restart");
  }
  train::validate(o.loop, 1);
}

void validate(const TrainingProgramOptions& o) {
  if (o.init_optimizer) validate_init_optimizer(o);
  if (o.loop.in_job_recovery) validate_recovery(o);
  if (o.loop.strategy == Strategy::kFsdp) validate_fsdp(o);
  // The loop's refusal of sharded checkpoints without fsdp, before the rendezvous (it needs no world size).
  if (o.loop.checkpoint_format == checkpoint::CheckpointFormat::kSharded) train::validate(o.loop, 1);
  const bool dp = o.loop.strategy == Strategy::kDataParallel;
  if (o.dp_replicas > 0 && !dp) {
    throw InvalidArgument(needs("--dp-replicas", "--strategy dp") +
                          " (ddp runs one replica per process: tandem run --nproc-per-node)");
  }
  if (o.sync_bn && dp) {
    throw InvalidArgument(needs("--sync-bn", "--strategy ddp",
                                "DataParallel's replicas are threads of one process, with no process group to share "
                                "statistics over"));
  }
  if (o.sync_bn && !has_batch_norm(o.model)) {
    throw InvalidArgument(fmt::format("--sync-bn: model '{}' has no BatchNorm layers to synchronise; drop --sync-bn, "
                                      "or train a model that has them ({})",
                                      o.model, models_by_batch_norm(true)));
  }
  if (o.zero && dp) {
    throw InvalidArgument(needs("--zero", "--strategy ddp",
                                "it shards the optimizer state among processes, and DataParallel's replicas are "
                                "threads of one"));
  }
}

namespace {

// --save-weights: a file, or with a trailing '/' a new folder of sharded safetensors (checkpoint/weights.h).
void require_weights_output(const std::string& path) {
  if (path.back() != '/') {
    require_writable_file("--save-weights", path);
    return;
  }
  if (std::filesystem::exists(path)) {
    throw InvalidArgument(fmt::format("--save-weights {}: exists already, and a run's data is never overwritten; name "
                                      "a new folder (a path ending in '/' writes sharded safetensors into one)", path));
  }
  require_creatable_folder("--save-weights", path);
}

// --optimizer with its hyper-parameters, as ZeroRedundancyOptimizer and a plain run both make it.
optim::OptimizerFactory optimizer_factory(const TrainingProgramOptions& o) {
  const std::tuple<double, double> betas{o.betas.at(0), o.betas.at(1)};
  if (o.optimizer == "adam") {
    return optim::make_optimizer<torch::optim::Adam>(
        torch::optim::AdamOptions(o.lr).betas(betas).eps(o.eps).weight_decay(o.weight_decay));
  }
  if (o.optimizer == "adamw") {
    return optim::make_optimizer<torch::optim::AdamW>(
        torch::optim::AdamWOptions(o.lr).betas(betas).eps(o.eps).weight_decay(o.weight_decay));
  }
  if (o.optimizer == "rmsprop") {
    return optim::make_optimizer<torch::optim::RMSprop>(
        torch::optim::RMSpropOptions(o.lr).eps(o.eps).weight_decay(o.weight_decay).momentum(o.momentum));
  }
  TANDEM_CHECK(o.optimizer == "sgd", "an --optimizer that validate() let through: ", o.optimizer);
  return optim::make_optimizer<torch::optim::SGD>(
      torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
}

// --init-optimizer: every rank reads the state whole, as it read the weights.
void import_optimizer(const TrainingProgramOptions& o, const nn::Model& model, torch::optim::Optimizer& optimizer,
                      const comm::CommunicatorPtr& communicator) {
  comm::run_on_all_ranks(communicator.get(), "to load --init-optimizer", [&] {
    const checkpoint::ImportedOptimizerState imported = checkpoint::import_optimizer_state(
        checkpoint::read_distributed_checkpoint(o.init_weights), *model.module.ptr(), optimizer, o.init_weights);
    log::main_info("continued {}'s state from {}: {} parameters at step {} (the learning rate is this run's "
                   "schedule's)", imported.optimizer, o.init_weights, imported.parameters, imported.step);
  });
}

}  // namespace

train::TrainResult run_training(const TrainingProgramOptions& given, const comm::CommunicatorPtr& communicator) {
  comm::Communicator* group = communicator.get();
  const int world = group ? group->world_size() : 1;
  // Under in-job recovery a process without a group is a lost worker's replacement, which the loop takes in.
  const bool replacement = given.loop.in_job_recovery && !group;
  const bool is_main = (!group || group->rank() == 0) && !replacement;
  // The loop multiplies the rate by the world size into a float32 scalar: --lr's own range cannot see the world.
  const double scaled_lr = given.loop.scale_lr_by_world_size ? given.lr * world : given.lr;
  if (scaled_lr > std::numeric_limits<float>::max()) {
    throw InvalidArgument(fmt::format("--lr {} times the {} ranks is past float32's largest value ({}); use a "
                                      "lower --lr",
                                      given.lr, world, std::numeric_limits<float>::max()));
  }
  TrainingProgramOptions options = given;
  options.data.seed = options.loop.seed;
  options.loop.model_name = options.model;
  if (options.loop.strategy == Strategy::kDataParallel) {
    options.loop.dp_devices = dp::replica_devices(options.loop.device, options.dp_replicas);
  }

  // The paths the run writes into are checked before the data loads: one that failed at the end would throw the
  // whole training away.
  data::DataFolder data;
  comm::run_on_all_ranks(group, "to check the output paths and load the data set", [&] {
    if (is_main) {
      train::check_run_outputs(options.loop);
      if (!options.save_weights.empty()) require_weights_output(options.save_weights);
    }
    data = data::open_data_folder(options.data);
  });
  nn::Model model = build_model(options, data, communicator);

  train::Loop loop(options.loop, communicator);
  train::LoopCallbacks& callbacks = loop.callbacks();
  callbacks.on_run_start = [&](const std::string& run_dir, const std::string& checkpoint) {
    options.loop.run_dir = run_dir;
    if (!is_main) return;
    log::write("", "training configuration:\n" + describe_configuration(options, data, world, checkpoint));
    if (!data.classes.empty()) data::write_class_list(data.classes, run_dir + "/class_indices.json");
  };
  if (data.image_train) {
    callbacks.on_epoch_start = [&](int epoch) { data.image_train->set_epoch(epoch); };
    callbacks.on_epoch_end = [&](const train::EpochMetrics&) {
      const data::ImageFolderDataset& images = *data.image_train;
      if (images.skipped_images() == 0) return;
      const std::string emptied =
          images.emptied_batches() == 0
              ? ""
              : fmt::format("; {} of this rank's batches lost every image, and it trained on no sample in their steps",
                            images.emptied_batches());
      log::warn("skipped {} unreadable training images so far (--skip-bad-images){}", images.skipped_images(), emptied);
    };
  }
  // The optimizer, sharded among the ranks with --zero; with --init-optimizer its state from --init first (fsdp
  // then cuts its shards of it, as of any state).
  const optim::OptimizerFactory make = optimizer_factory(options);
  const auto fit = [&](torch::optim::Optimizer& optimizer) {
    return loop.fit(model.module, optimizer, data.train, data.eval);
  };
  train::TrainResult result;
  if (options.zero) {
    optim::ZeroRedundancyOptimizer sharded(nn::trainable_parameters(model), make, communicator);
    result = loop.fit(model.module, sharded, data.train, data.eval);
  } else {
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        make({torch::optim::OptimizerParamGroup(nn::trainable_parameters(model))});
    if (options.init_optimizer) import_optimizer(options, model, *optimizer, communicator);
    result = fit(*optimizer);
  }

  // In-job recovery may have changed the group during the run: the one training ended with saves. A replacement
  // that the run ended without never trained, and saves nothing.
  const comm::CommunicatorPtr last = options.loop.in_job_recovery ? default_group().communicator_ptr() : communicator;
  if (replacement && !last) return result;
  comm::run_on_all_ranks(last.get(), "to save --save-weights", [&] {
    if ((!last || last->rank() == 0) && !options.save_weights.empty()) {
      checkpoint::save_weights(*model.module.ptr(), options.save_weights,
                          {{"model", options.model}, {"step", std::to_string(result.steps)}});
      log::write("", "wrote weights to " + options.save_weights);
    }
  });
  return result;
}

}  // namespace tandem::app
