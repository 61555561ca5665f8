#include "tandem/train/trainer.h"

#include <dirent.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <sstream>

#include "tandem/data/batch_sampler.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/nn/model_registry.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/lr_schedule.h"
#include "tandem/train/progress.h"
#include "tandem/train/safetensors.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

// Pointer-like view of a registered model, shaped like a TORCH_MODULE holder (`*h` is the module, `h->forward`
// runs it), so ddp::DistributedDataParallel wraps whatever --model names.
class ModelHolder {
 public:
  explicit ModelHolder(torch::nn::AnyModule module) : module_(std::move(module)) {}
  torch::nn::Module& operator*() const { return *module_.ptr(); }
  ModelHolder* operator->() { return this; }
  torch::Tensor forward(const torch::Tensor& x) { return module_.forward(x); }

 private:
  torch::nn::AnyModule module_;
};

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

// The newest run under runs/ (timestamps sort by name) that holds a checkpoint.
std::string newest_run_dir() {
  std::string best;
  if (DIR* dir = ::opendir("runs")) {
    while (dirent* entry = ::readdir(dir)) {
      std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (name > best && find_latest_checkpoint("runs/" + name)) best = name;
    }
    ::closedir(dir);
  }
  return best.empty() ? "" : "runs/" + best;
}

// Rank 0's string, on every rank.
std::string broadcast_string(const std::string& value, comm::Communicator* communicator) {
  if (!communicator || communicator->world_size() < 2) return value;
  torch::Tensor length = torch::tensor({static_cast<int64_t>(value.size())});
  communicator->broadcast(length, 0)->wait();
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (communicator->rank() == 0 && !value.empty()) std::memcpy(bytes.data_ptr(), value.data(), value.size());
  if (bytes.numel() > 0) communicator->broadcast(bytes, 0)->wait();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
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
  communicator->all_reduce(failed, comm::ReduceOp::Sum)->wait();
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

std::string format_lr(double lr) { return fmt::format("{:.6g}", lr); }

}  // namespace

EvalCounts evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward, data::BatchLoader& loader,
                    int64_t epoch, comm::Communicator* communicator) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0, total = 0;
  loader.start_epoch(epoch);
  while (std::optional<data::Batch> batch = loader.next()) {
    const int64_t real = batch->real_count();
    if (real == 0) continue;
    torch::Tensor predicted = forward(batch->data).argmax(1).slice(0, 0, real);
    correct += predicted.eq(batch->target.slice(0, 0, real)).sum().item<int64_t>();
    total += real;
  }
  // float64 holds counts exactly up to 2^53; every backend reduces it.
  torch::Tensor counts = torch::tensor({static_cast<double>(correct), static_cast<double>(total)}, torch::kFloat64);
  if (communicator && communicator->world_size() > 1) communicator->all_reduce(counts, comm::ReduceOp::Sum)->wait();
  return {static_cast<int64_t>(counts[0].item<double>()), static_cast<int64_t>(counts[1].item<double>())};
}

std::string describe(const TrainOptions& o, int world_size) {
  const data::Normalization norm = o.normalization ? *o.normalization : data::guess_normalization(o.data_dir);
  std::string out;
  const auto line = [&](const std::string& key, const std::string& value) { out += fmt::format("  {:<14} {}\n", key + ":", value); };
  line("data", o.data_dir);
  line("model", o.model);
  line("world size", std::to_string(world_size));
  line("epochs", std::to_string(o.epochs));
  line("batch size", fmt::format("{} per process, {} in all", o.batch_size, o.batch_size * world_size));
  line("lr", fmt::format("{} x {} ranks = {} (cosine to x{})", o.lr, world_size, o.lr * world_size, o.lrf));
  line("momentum", fmt::format("{}", o.momentum));
  line("weight decay", fmt::format("{}", o.weight_decay));
  line("steps", o.max_steps > 0 ? std::to_string(o.max_steps) : "all");
  line("seed", std::to_string(o.seed));
  line("shuffle", o.shuffle ? "yes" : "no");
  line("normalize", fmt::format("mean {} std {}", norm.mean, norm.std));
  line("threads", std::to_string(torch::get_num_threads()) + " per process");
  line("init weights", o.init_weights.empty() ? "none (rank 0's seeded init, broadcast)" : o.init_weights);
  if (!o.init_weights.empty()) line("strict", o.strict ? "yes" : "no");
  line("freeze layers", o.freeze_layers ? "yes" : "no");
  line("save weights", o.save_weights.empty() ? "no" : o.save_weights);
  line("run dir", o.run_dir);
  line("resume", o.resume ? "yes" : "no");
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
    if (options.run_dir.empty()) options.run_dir = options.resume ? newest_run_dir() : timestamped_run_dir();
    if (options.resume) {
      if (options.run_dir.empty()) throw InvalidArgument("--resume: no run under runs/ holds a checkpoint; pass --run-dir");
      auto latest = find_latest_checkpoint(options.run_dir);
      if (!latest) throw InvalidArgument("--resume: no checkpoint in " + options.run_dir);
      resume_from = *latest;
    }
    make_dirs(options.run_dir);
  });
  options.run_dir = broadcast_string(options.run_dir, communicator);
  resume_from = broadcast_string(resume_from, communicator);

  const data::Normalization normalization =
      options.normalization ? *options.normalization : data::guess_normalization(options.data_dir);
  std::shared_ptr<data::MnistDataset> train_set, test_set;
  on_all_ranks(communicator, "to load the data set", [&] {
    train_set = std::make_shared<data::MnistDataset>(options.data_dir, data::MnistSplit::kTrain, normalization);
    test_set = std::make_shared<data::MnistDataset>(options.data_dir, data::MnistSplit::kTest, normalization);
  });
  if (is_main) log::write("", "training configuration:\n" + describe(options, world));

  // Seeded init on every rank; DDP's construction then makes every rank start from rank 0's weights.
  torch::manual_seed(options.seed);
  nn::ModelOptions model_options;
  model_options.in_channels = train_set->images().size(1);
  model_options.image_size = train_set->images().size(2);
  model_options.num_classes = std::max<int64_t>(10, train_set->labels().max().item<int64_t>() + 1);
  nn::Model model = nn::make_model(options.model, model_options);
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
  if (options.freeze_layers) {
    auto trainable = nn::freeze_all_but_head(model);
    log::main_info("--freeze-layers: training {} tensors of the classifier head", trainable.size());
  }
  ddp::DistributedDataParallel<ModelHolder> ddp_model(ModelHolder(model.module), communicator_ptr);

  std::vector<torch::Tensor> trainable;
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  const CosineSchedule schedule(options.lr * world, options.lrf, options.epochs);
  torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(schedule.lr(0))
                                             .momentum(options.momentum)
                                             .weight_decay(options.weight_decay));

  int start_epoch = 0;
  int64_t skip_batches = 0, step = 0;
  if (!resume_from.empty()) {
    CheckpointState state;
    on_all_ranks(communicator, "to load the checkpoint", [&] {
      state = load_checkpoint(resume_from, module, optimizer);
      if (state.world_size != world || state.sampler_seed != options.seed || state.epochs != options.epochs) {
        throw InvalidArgument(fmt::format(
            "{} was written by a run with world size {}, --seed {}, --epochs {}; resume with the same values "
            "(now {}, {}, {})",
            resume_from, state.world_size, state.sampler_seed, state.epochs, world, options.seed, options.epochs));
      }
    });
    start_epoch = state.epoch;
    skip_batches = state.batches_done;
    step = state.step;
    log::main_info("resuming from {} (epoch {}, batch {}, step {})", resume_from, start_epoch, skip_batches, step);
  }

  data::DistributedSamplerOptions train_sampling{world, rank, options.shuffle, options.seed, false};
  data::BatchLoader train_loader(train_set,
                                 data::BatchSampler(data::DistributedSampler(train_set->size(), train_sampling),
                                                    options.batch_size, /*drop_last=*/true),
                                 data::BatchLoaderOptions{options.prefetch_batches});
  data::DistributedSamplerOptions test_sampling{world, rank, false, options.seed, false};
  data::BatchLoader test_loader(test_set,
                                data::BatchSampler(data::DistributedSampler(test_set->size(), test_sampling),
                                                   options.batch_size, /*drop_last=*/false),
                                data::BatchLoaderOptions{options.prefetch_batches});
  const int64_t batches_per_epoch = train_loader.num_batches();
  if (batches_per_epoch == 0) {
    throw InvalidArgument(fmt::format("{} has {} training samples: fewer than one batch of {} per rank over {} ranks",
                                      options.data_dir, train_set->size(), options.batch_size, world));
  }

  std::unique_ptr<MetricsWriter> metrics;
  if (is_main) metrics = std::make_unique<MetricsWriter>(options.run_dir + "/metrics.jsonl");
  ProgressOptions progress_options;
  progress_options.enabled = is_main && options.progress;
  ProgressReporter progress(options.epochs, batches_per_epoch, options.batch_size * world, progress_options);

  TrainResult result;
  result.run_dir = options.run_dir;
  const auto forward = [&](const torch::Tensor& x) { return ddp_model.forward(x); };
  bool stop = options.max_steps > 0 && step >= options.max_steps;
  for (int epoch = start_epoch; epoch < options.epochs && !stop; ++epoch) {
    const double lr = schedule.lr(epoch);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
    ddp_model.train();
    train_loader.start_epoch(epoch);
    // A mid-epoch checkpoint: replay the sampler's order past the batches already trained on.
    int64_t batch_index = 0;
    for (; batch_index < skip_batches && train_loader.next(); ++batch_index) {
    }
    skip_batches = 0;
    progress.start_epoch(epoch, batch_index);
    // [loss sum, non-finite flag of rank 0, ..., of rank W-1]: one all-reduce per step for both.
    torch::Tensor step_stats = torch::zeros({1 + world}, torch::kFloat64);
    double loss_sum = 0;
    int64_t loss_count = 0, epoch_steps = 0;
    const auto start = std::chrono::steady_clock::now();
    while (std::optional<data::Batch> batch = train_loader.next()) {
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(forward(batch->data), batch->target);
      if (rank == injection.rank && step == injection.step) loss = loss * std::numeric_limits<float>::quiet_NaN();
      loss.backward();
      const double local_loss = loss.item<double>();
      step_stats.zero_();
      if (std::isfinite(local_loss)) {
        step_stats[0] = local_loss;
      } else {
        step_stats[1 + rank] = 1.0;
      }
      if (world > 1) communicator->all_reduce(step_stats, comm::ReduceOp::Sum)->wait();
      std::vector<int> bad_ranks;
      for (int r = 0; r < world; ++r) {
        if (step_stats[1 + r].item<double>() > 0) bad_ranks.push_back(r);
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
      loss_sum += step_stats[0].item<double>() / world;
      ++loss_count;
      progress.update(batch_index, loss_sum / loss_count);
      ++batch_index;
      if (options.max_steps > 0 && step >= options.max_steps) {
        stop = true;
        break;
      }
    }
    const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.end_epoch();
    const bool epoch_complete = batch_index >= batches_per_epoch;

    // Evaluation runs the bare model: its weights are identical on every rank, and DDP has no gradients to
    // reduce here.
    ddp_model.eval();
    const EvalCounts counts = evaluate([&](const torch::Tensor& x) { return model.module.forward(x); }, test_loader,
                                       epoch, communicator);
    EpochMetrics m;
    m.epoch = epoch;
    m.loss = loss_count > 0 ? loss_sum / loss_count : 0.0;
    m.accuracy = counts.accuracy();
    m.correct = counts.correct;
    m.total = counts.total;
    m.lr = lr;
    m.train_seconds = train_seconds;
    m.samples_per_second = train_seconds > 0 ? epoch_steps * options.batch_size * world / train_seconds : 0.0;
    m.step = step;
    result.epochs.push_back(m);

    on_all_ranks(communicator, "to write the checkpoint", [&] {
      if (!is_main) return;
      std::printf("[epoch %d] loss %.4f accuracy %.4f lr %s\n", epoch, m.loss, m.accuracy, format_lr(lr).c_str());
      std::fflush(stdout);
      metrics->write(m);
      if (!options.checkpoint) return;
      CheckpointState state;
      state.epoch = epoch_complete ? epoch + 1 : epoch;
      state.batches_done = epoch_complete ? 0 : batch_index;
      state.step = step;
      state.lr = lr;
      state.base_lr = schedule.base_lr();
      state.lrf = options.lrf;
      state.epochs = options.epochs;
      state.sampler_seed = options.seed;
      state.world_size = world;
      save_checkpoint(checkpoint_path(options.run_dir, state.epoch, state.batches_done), module, optimizer, state);
    });
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
