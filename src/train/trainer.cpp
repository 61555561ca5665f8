#include "tandem/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>

#include "tandem/comm/value_collectives.h"
#include "tandem/data/batch_sampler.h"
#include "tandem/data/data_agreement.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/data/image_folder.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/nn/model_holder.h"
#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/lr_schedule.h"
#include "tandem/train/progress.h"
#include "tandem/train/safetensors.h"
#include "tandem/util/compat.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

struct NanInjection {
  int rank = -1;
  int64_t step = -1;
};

// TANDEM_INJECT_NAN_AT_STEP=RANK:STEP (test hook, see trainer.h).
NanInjection nan_injection_from_env() {
  NanInjection injection;
  const char* value = std::getenv("TANDEM_INJECT_NAN_AT_STEP");
  if (!value) return injection;
  long long step = -1;
  if (std::sscanf(value, "%d:%lld", &injection.rank, &step) != 2) {
    throw InvalidArgument(std::string("TANDEM_INJECT_NAN_AT_STEP must be RANK:STEP, got '") + value + "'");
  }
  injection.step = step;
  return injection;
}

void make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw Error("cannot create directory " + partial + ": " + std::strerror(errno));
    }
  }
}

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// runs/YYYYmmdd-HHMMSS, with a suffix if that name is taken.
std::string timestamped_run_dir() {
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string dir = std::string("runs/") + stamp;
  for (int i = 1; exists(dir); ++i) dir = std::string("runs/") + stamp + "-" + std::to_string(i);
  return dir;
}

// Rank 0's string, on every rank.
std::string broadcast_string(const std::string& value, comm::Communicator* communicator) {
  return communicator ? comm::broadcast_string(*communicator, value) : value;
}

// Rank 0 may fail alone (an unwritable run dir, a bad checkpoint). Every rank calls this at the same point
// with whether it failed and why, so that all ranks stop together instead of leaving the others in a
// collective; the rank that failed rethrows its own error, the others say which rank failed.
void agree_or_throw(std::exception_ptr local, comm::Communicator* communicator, const std::string& what) {
  if (!communicator || communicator->world_size() < 2) {
    if (local) std::rethrow_exception(local);
    return;
  }
  torch::Tensor failed = torch::zeros({communicator->world_size()}, torch::kFloat64);
  if (local) failed[communicator->rank()] = 1.0;
  comm::all_reduce_values(*communicator, failed, comm::ReduceOp::Sum);
  if (local) std::rethrow_exception(local);
  for (int r = 0; r < communicator->world_size(); ++r) {
    if (failed[r].item<double>() > 0) throw Error(detail::concat("rank ", r, " failed ", what, "; stopping"));
  }
}

template <typename Fn>
void on_all_ranks(comm::Communicator* communicator, const std::string& what, Fn&& fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  agree_or_throw(error, communicator, what);
}

// [sum of the finite losses, non-finite flag of rank 0, ..., of rank W-1] over all ranks, on the host: built on
// the loss's device, so the step costs one all-reduce and one read for both the metric and the NaN check.
torch::Tensor reduce_step_statistics(const torch::Tensor& loss, int rank, comm::Communicator* communicator) {
  const int world = communicator ? communicator->world_size() : 1;
  torch::Tensor value = loss.detach().to(torch::kFloat64).reshape({1});
  torch::Tensor finite = torch::isfinite(value);
  torch::Tensor stats = torch::zeros({1 + world}, value.options());
  stats.narrow(0, 0, 1).copy_(torch::where(finite, value, torch::zeros_like(value)));
  stats.narrow(0, 1 + rank, 1).copy_(finite.logical_not().to(torch::kFloat64));
  if (world > 1) comm::all_reduce_values(*communicator, stats, comm::ReduceOp::Sum);
  return stats.cpu();
}

std::string format_lr(double lr) { return fmt::format("{:.6g}", lr); }

bool is_image_folder(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(error) && !name.empty() && name[0] != '.') return true;
  }
  return false;
}

// --data opened as a training set and an evaluation set, with what the model factory needs to know.
struct TrainingData {
  std::shared_ptr<const data::Dataset> train, eval;
  std::shared_ptr<data::ImageFolderDataset> image_train;  // image folders: the training set, for set_epoch
  std::vector<std::string> classes;                        // image folders: label i's folder name
  nn::ModelOptions model;
};

// Tells an MNIST folder from an image folder and opens it; resolves options' data-dependent defaults
// (num_classes, image_size, min_crop_scale) in place, so every rank and describe() see the same values.
TrainingData open_training_data(TrainOptions& o) {
  TrainingData d;
  if (data::has_mnist_files(o.data_dir)) {
    const data::Normalization normalization = o.normalization ? *o.normalization : data::guess_normalization(o.data_dir);
    auto train_set = std::make_shared<data::MnistDataset>(o.data_dir, data::MnistSplit::kTrain, normalization);
    d.eval = std::make_shared<data::MnistDataset>(o.data_dir, data::MnistSplit::kTest, normalization);
    const int64_t side = train_set->images().size(2);
    if (o.image_size != 0 && o.image_size != side) {
      throw InvalidArgument(fmt::format("--image-size {}: {} holds MNIST files of {}x{} images, which are used as "
                                        "they are; drop --image-size, or export an image folder (tandem "
                                        "export-images DIR) to train at another size",
                                        o.image_size, o.data_dir, side, side));
    }
    d.model.in_channels = train_set->images().size(1);
    d.model.image_size = side;
    d.model.num_classes = std::max<int64_t>(10, train_set->labels().max().item<int64_t>() + 1);
    d.train = train_set;
  } else if (is_image_folder(o.data_dir)) {
    data::ImageFolderSplit split = data::read_split_data(o.data_dir, o.val_split, o.seed);
    if (o.image_size == 0) o.image_size = 224;
    if (o.min_crop_scale == 0) o.min_crop_scale = default_min_crop_scale(o.image_size);
    data::ImageFolderOptions folder;
    folder.transform.image_size = o.image_size;
    folder.transform.min_crop_scale = o.min_crop_scale;
    folder.transform.resize_ratio = default_val_resize_ratio(o.image_size);
    folder.num_threads = std::max(1, torch::get_num_threads());
    folder.skip_bad_images = o.skip_bad_images;
    folder.seed = o.seed;
    data::ImageFolderOptions eval_folder = folder;
    folder.transform.train = true;
    d.image_train = std::make_shared<data::ImageFolderDataset>(std::move(split.train), folder);
    d.eval = std::make_shared<data::ImageFolderDataset>(std::move(split.val), eval_folder);
    d.train = d.image_train;
    d.model.in_channels = 3;
    d.model.image_size = o.image_size;
    d.model.num_classes = static_cast<int64_t>(split.classes.size());
    d.classes = std::move(split.classes);
  } else {
    throw InvalidArgument(fmt::format(
        "--data {} {}; expected MNIST files (train-images-idx3-ubyte[.gz] and the other three) or an image folder "
        "(one sub-folder of .jpg/.png images per class)",
        o.data_dir, std::filesystem::exists(o.data_dir) ? "holds neither" : "does not exist"));
  }
  if (o.num_classes == 0) o.num_classes = d.model.num_classes;
  if (o.num_classes < d.model.num_classes) {
    throw InvalidArgument(fmt::format("--num-classes {} is fewer than the {} classes in {}", o.num_classes,
                                      d.model.num_classes, o.data_dir));
  }
  d.model.num_classes = o.num_classes;
  return d;
}

}  // namespace

double default_min_crop_scale(int64_t image_size) {
  const double side = static_cast<double>(std::max<int64_t>(1, image_size));
  return std::clamp(0.08 * (224.0 / side) * (224.0 / side), 0.08, 1.0);
}

double default_val_resize_ratio(int64_t image_size) {
  constexpr double kTorchvision = 256.0 / 224.0;
  return 1.0 + (kTorchvision - 1.0) * std::min(1.0, static_cast<double>(image_size) / 224.0);
}

EvalCounts evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward, data::BatchLoader& loader,
                    int64_t epoch, comm::Communicator* communicator) {
  torch::NoGradGuard no_grad;
  torch::Tensor correct;  // on the model's device, read once at the end rather than once per batch
  int64_t total = 0;
  loader.start_epoch(epoch);
  while (std::optional<data::Batch> batch = loader.next()) {
    // Every rank runs the same number of forwards, even on a batch that is all padding: a model whose forward
    // communicates would otherwise wait for a rank that skipped it. The padding is dropped afterwards.
    if (batch->data.size(0) == 0) continue;
    const int64_t real = batch->real_count();
    torch::Tensor predicted = forward(batch->data).argmax(1).slice(0, 0, real);
    torch::Tensor hits = predicted.eq(batch->target.slice(0, 0, real)).sum();
    correct = correct.defined() ? correct + hits : hits;
    total += real;
  }
  // float64 holds counts exactly up to 2^53; every backend reduces it.
  torch::Tensor counts = torch::tensor({correct.defined() ? correct.item<double>() : 0.0, static_cast<double>(total)},
                                       torch::kFloat64);
  if (communicator && communicator->world_size() > 1) comm::all_reduce_values(*communicator, counts, comm::ReduceOp::Sum);
  return {static_cast<int64_t>(counts[0].item<double>()), static_cast<int64_t>(counts[1].item<double>())};
}

std::string describe(const TrainOptions& o, int world_size) {
  const bool mnist = data::has_mnist_files(o.data_dir);
  std::string out;
  const auto line = [&](const std::string& key, const std::string& value) { out += fmt::format("  {:<14} {}\n", key + ":", value); };
  line("data", o.data_dir + (mnist ? " (MNIST files)" : " (image folder)"));
  line("model", fmt::format("{}, {} classes{}", o.model, o.num_classes, o.sync_bn ? ", SyncBatchNorm" : ""));
  line("world size", std::to_string(world_size));
  line("device", o.device.str());
  line("epochs", std::to_string(o.epochs));
  line("batch size", fmt::format("{} per process, {} in all", o.batch_size, o.batch_size * world_size));
  line("lr", fmt::format("{} x {} ranks = {} (cosine to x{})", o.lr, world_size, o.lr * world_size, o.lrf));
  line("momentum", fmt::format("{}", o.momentum));
  line("weight decay", fmt::format("{}", o.weight_decay));
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
                                   o.min_crop_scale, default_val_resize_ratio(o.image_size)));
    line("bad images", o.skip_bad_images ? "skip and count" : "stop with an error");
  }
  line("threads", std::to_string(torch::get_num_threads()) + " per process");
  line("init weights", o.init_weights.empty() ? "none (rank 0's seeded init, broadcast)" : o.init_weights);
  if (!o.init_weights.empty()) line("strict", o.strict ? "yes" : "no");
  line("freeze layers", o.freeze_layers ? "yes" : "no");
  line("save weights", o.save_weights.empty() ? "no" : o.save_weights);
  line("run dir", o.run_dir);
  line("resume", o.resume ? "yes" : "no");
  line("check replicas", o.check_replicas_every > 0 ? fmt::format("every {} steps", o.check_replicas_every) : "no");
  line("checkpoints", !o.checkpoint ? "none"
                      : fmt::format("at epoch ends{}; the newest {} kept",
                                    o.checkpoint_every > 0 ? fmt::format(" and every {} steps", o.checkpoint_every) : "",
                                    o.keep_checkpoints > 0 ? std::to_string(o.keep_checkpoints) : "all"));
  return out;
}

TrainResult train(const TrainOptions& given, const comm::CommunicatorPtr& communicator_ptr) {
  comm::Communicator* communicator = communicator_ptr.get();
  const int rank = communicator ? communicator->rank() : 0;
  const int world = communicator ? communicator->world_size() : 1;
  const bool is_main = rank == 0;
  TrainOptions options = given;
  if (options.epochs < 1) throw InvalidArgument("--epochs must be at least 1");
  if (options.batch_size < 1) throw InvalidArgument("--batch-size must be at least 1");
  if (options.lr <= 0) throw InvalidArgument("--lr must be positive");
  const NanInjection injection = nan_injection_from_env();

  // The run directory and the checkpoint to resume from are rank 0's choice, shared with every rank.
  std::string resume_from;
  on_all_ranks(communicator, "to prepare the run directory", [&] {
    if (!is_main) return;
    if (options.run_dir.empty()) options.run_dir = options.resume ? newest_run_dir("runs") : timestamped_run_dir();
    if (options.run_dir.empty()) throw InvalidArgument("--resume: no run under runs/ holds a checkpoint; pass --run-dir");
    auto latest = find_latest_checkpoint(options.run_dir);
    if (options.resume && !latest) throw InvalidArgument("--resume: no checkpoint in " + options.run_dir);
    if (latest) resume_from = *latest;
    make_dirs(options.run_dir);
    remove_unfinished_checkpoints(options.run_dir);
  });
  options.run_dir = broadcast_string(options.run_dir, communicator);
  resume_from = broadcast_string(resume_from, communicator);

  TrainingData sets;
  on_all_ranks(communicator, "to load the data set", [&] { sets = open_training_data(options); });
  const std::shared_ptr<const data::Dataset>& train_set = sets.train;
  const std::shared_ptr<const data::Dataset>& test_set = sets.eval;
  if (communicator) {
    data::verify_ranks_hold_same_data(*communicator, *train_set, "training data");
    data::verify_ranks_hold_same_data(*communicator, *test_set, "evaluation data");
  }
  if (is_main) log::write("", "training configuration:\n" + describe(options, world));
  on_all_ranks(communicator, "to write the class list", [&] {
    if (is_main && !sets.classes.empty()) data::write_class_list(sets.classes, options.run_dir + "/class_indices.json");
  });

  // Seeded init on every rank; DDP's construction then makes every rank start from rank 0's weights.
  torch::manual_seed(options.seed);
  nn::Model model;
  on_all_ranks(communicator, "to build the model", [&] { model = nn::make_model(options.model, sets.model); });
  torch::nn::Module& module = *model.module.ptr();
  on_all_ranks(communicator, "to load --init weights", [&] {
    if (options.init_weights.empty()) return;
    LoadReport report = load_weights(module, options.init_weights, options.strict);
    if (is_main) {
      log::write("", fmt::format("loaded {} tensors from {}", report.loaded.size(), options.init_weights));
      for (const auto& s : report.skipped) log::warn("skipped {}", s);
      for (const auto& m : report.missing) log::warn("not in {}: {} (keeps its initial value)", options.init_weights, m);
    }
  });
  // SyncBatchNorm before DDP and the optimizer (as PyTorch requires): the swap keeps the parameter tensors, and
  // DDP must see the model it will run.
  if (options.sync_bn) {
    nn::convert_sync_batchnorm(model.module.ptr(), communicator_ptr);
    if (nn::count_sync_batchnorm(module) == 0 && is_main) {
      log::warn("--sync-bn: model '{}' has no BatchNorm layers; training it unchanged", options.model);
    }
  }
  if (options.freeze_layers) {
    auto trainable = nn::freeze_all_but_head(model);
    log::main_info("--freeze-layers: training {} tensors of the classifier head", trainable.size());
  }
  // Onto the rank's device after every swap and freeze, before DDP forms its buckets on the gradients' device.
  module.to(options.device);
  ddp::DdpOptions ddp_options;
  ddp_options.check_replicas_every = options.check_replicas_every;
  ddp::DistributedDataParallel<nn::ModelHolder> ddp_model(nn::ModelHolder(model.module), communicator_ptr,
                                                          ddp_options);

  std::vector<torch::Tensor> trainable;
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  const CosineSchedule schedule(options.lr * world, options.lrf, options.epochs);
  torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(schedule.lr(0))
                                             .momentum(options.momentum)
                                             .weight_decay(options.weight_decay));

  CheckpointState resumed;
  if (!resume_from.empty()) {
    on_all_ranks(communicator, "to load the checkpoint", [&] {
      resumed = load_checkpoint(resume_from, module, optimizer);
      if (resumed.world_size != world || resumed.sampler_seed != options.seed || resumed.epochs != options.epochs) {
        throw InvalidArgument(fmt::format(
            "{} was written by a run with world size {}, --seed {}, --epochs {}; resume with the same values "
            "(now {}, {}, {}), or start a new run in another --run-dir",
            resume_from, resumed.world_size, resumed.sampler_seed, resumed.epochs, world, options.seed,
            options.epochs));
      }
    });
    log::main_info("resuming from {} (epoch {}, batch {}, step {})", resume_from, resumed.epoch,
                   resumed.batches_done, resumed.step);
    if (resumed.epoch >= options.epochs || (options.max_steps > 0 && resumed.step >= options.max_steps)) {
      log::main_info("{} has already finished training; nothing is left to do (pass another --run-dir for a new run)",
                     options.run_dir);
    }
  }
  int64_t step = resumed.step;

  data::DistributedSamplerOptions train_sampling{world, rank, options.shuffle, options.seed, false};
  data::BatchLoader train_loader(train_set,
                                 data::BatchSampler(data::DistributedSampler(train_set->size(), train_sampling),
                                                    options.batch_size, /*drop_last=*/true),
                                 data::BatchLoaderOptions{options.prefetch_batches, options.device});
  data::DistributedSamplerOptions test_sampling{world, rank, false, options.seed, false};
  data::BatchLoader test_loader(test_set,
                                data::BatchSampler(data::DistributedSampler(test_set->size(), test_sampling),
                                                   options.batch_size, /*drop_last=*/false),
                                data::BatchLoaderOptions{options.prefetch_batches, options.device});
  const int64_t batches_per_epoch = train_loader.num_batches();
  if (batches_per_epoch == 0) {
    throw InvalidArgument(fmt::format("{} has {} training samples: fewer than one batch of {} per rank over {} ranks",
                                      options.data_dir, train_set->size(), options.batch_size, world));
  }

  std::unique_ptr<MetricsWriter> metrics;
  on_all_ranks(communicator, "to open metrics.jsonl", [&] {
    if (is_main) metrics = std::make_unique<MetricsWriter>(options.run_dir + "/metrics.jsonl", resumed.epoch);
  });
  ProgressOptions progress_options;
  progress_options.enabled = is_main && options.progress;
  ProgressReporter progress(options.epochs, batches_per_epoch, options.batch_size * world, progress_options);

  TrainResult result;
  result.run_dir = options.run_dir;
  const auto forward = [&](const torch::Tensor& x) { return ddp_model.forward(x); };
  // Rank 0 writes the checkpoint; every rank learns whether it worked.
  const auto write_checkpoint = [&](const CheckpointState& state) {
    on_all_ranks(communicator, "to write the checkpoint", [&] {
      if (!is_main || !options.checkpoint) return;
      save_checkpoint(checkpoint_path(options.run_dir, state.epoch, state.batches_done), module, optimizer, state);
      prune_checkpoints(options.run_dir, options.keep_checkpoints);
    });
  };
  // The run's state after `batches_done` batches of `epoch`, with that epoch's loss and time so far.
  const auto checkpoint_state = [&](int epoch, int64_t batches_done, double lr, double epoch_loss_sum,
                                    int64_t epoch_steps, double epoch_train_seconds) {
    CheckpointState state;
    state.epoch = epoch;
    state.batches_done = batches_done;
    state.step = step;
    state.lr = lr;
    state.base_lr = schedule.base_lr();
    state.lrf = options.lrf;
    state.epochs = options.epochs;
    state.sampler_seed = options.seed;
    state.world_size = world;
    state.epoch_loss_sum = epoch_loss_sum;
    state.epoch_steps = epoch_steps;
    state.epoch_train_seconds = epoch_train_seconds;
    return state;
  };
  bool stop = options.max_steps > 0 && step >= options.max_steps;
  for (int epoch = resumed.epoch; epoch < options.epochs && !stop; ++epoch) {
    const double lr = schedule.lr(epoch);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
    ddp_model.train();
    if (sets.image_train) sets.image_train->set_epoch(epoch);
    // A checkpoint inside this epoch: its finished batches are skipped in the sampler's order, never loaded,
    // and its loss and time so far carry on into the epoch's metrics.
    const bool resumes_inside = epoch == resumed.epoch && resumed.batches_done > 0;
    int64_t batch_index = resumes_inside ? resumed.batches_done : 0;
    double loss_sum = resumes_inside ? resumed.epoch_loss_sum : 0;
    int64_t epoch_steps = resumes_inside ? resumed.epoch_steps : 0;
    const double earlier_seconds = resumes_inside ? resumed.epoch_train_seconds : 0;
    train_loader.start_epoch(epoch, batch_index);
    progress.start_epoch(epoch, batch_index);
    const auto start = std::chrono::steady_clock::now();
    const auto seconds_so_far = [&] {
      return earlier_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    while (std::optional<data::Batch> batch = train_loader.next()) {
      fault::kill_point("step", step + 1);
      compat::drop_gradients(optimizer);
      torch::Tensor logits = forward(batch->data);
      // Every image of this rank's batch was unreadable (--skip-bad-images): a zero loss still runs backward,
      // so this rank joins the gradient all-reduce like the others (a mean over no rows would be NaN).
      torch::Tensor loss = batch->size() > 0 ? torch::nn::functional::cross_entropy(logits, batch->target)
                                             : logits.sum() * 0.0;
      if (rank == injection.rank && step == injection.step) loss = loss * std::numeric_limits<float>::quiet_NaN();
      loss.backward();
      const torch::Tensor step_stats = reduce_step_statistics(loss, rank, communicator);
      const double* stats = step_stats.data_ptr<double>();
      std::vector<int> bad_ranks;
      for (int r = 0; r < world; ++r) {
        if (stats[1 + r] > 0) bad_ranks.push_back(r);
      }
      if (!bad_ranks.empty()) {
        progress.end_epoch();
        throw NonFiniteLossError(fmt::format(
            "non-finite loss on rank{} {} at step {} (epoch {}, batch {}); stopping all ranks. Try a lower --lr.",
            bad_ranks.size() > 1 ? "s" : "", fmt::join(bad_ranks, ","), step, epoch, batch_index));
      }
      optimizer.step();
      ++step;
      ++epoch_steps;
      loss_sum += stats[0] / world;
      progress.update(batch_index, loss_sum / epoch_steps);
      ++batch_index;
      if (options.max_steps > 0 && step >= options.max_steps) {
        stop = true;
        break;
      }
      if (options.checkpoint_every > 0 && step % options.checkpoint_every == 0 && batch_index < batches_per_epoch) {
        write_checkpoint(checkpoint_state(epoch, batch_index, lr, loss_sum, epoch_steps, seconds_so_far()));
      }
    }
    const double train_seconds = seconds_so_far();
    progress.end_epoch();
    const bool epoch_complete = batch_index >= batches_per_epoch;
    if (sets.image_train && sets.image_train->skipped_images() > 0) {
      log::warn("skipped {} unreadable training images so far (--skip-bad-images)", sets.image_train->skipped_images());
    }

    // Evaluation runs the bare model: its weights are identical on every rank, and DDP has no gradients to
    // reduce here.
    ddp_model.eval();
    const EvalCounts counts = evaluate([&](const torch::Tensor& x) { return model.module.forward(x); }, test_loader,
                                       epoch, communicator);
    EpochMetrics m;
    m.epoch = epoch;
    m.loss = epoch_steps > 0 ? loss_sum / epoch_steps : 0.0;
    m.accuracy = counts.accuracy();
    m.correct = counts.correct;
    m.total = counts.total;
    m.lr = lr;
    m.train_seconds = train_seconds;
    m.samples_per_second = train_seconds > 0 ? epoch_steps * options.batch_size * world / train_seconds : 0.0;
    m.step = step;
    result.epochs.push_back(m);

    on_all_ranks(communicator, "to write metrics.jsonl", [&] {
      if (!is_main) return;
      std::printf("[epoch %d] loss %.4f accuracy %.4f lr %s\n", epoch, m.loss, m.accuracy, format_lr(lr).c_str());
      std::fflush(stdout);
      metrics->write(m);
    });
    write_checkpoint(epoch_complete ? checkpoint_state(epoch + 1, 0, lr, 0, 0, 0)
                                    : checkpoint_state(epoch, batch_index, lr, loss_sum, epoch_steps, train_seconds));
  }
  result.steps = step;

  on_all_ranks(communicator, "to save --save-weights", [&] {
    if (is_main && !options.save_weights.empty()) {
      save_weights(module, options.save_weights, {{"model", options.model}, {"step", std::to_string(step)}});
      log::write("", "wrote weights to " + options.save_weights);
    }
  });
  return result;
}

}  // namespace tandem::train
