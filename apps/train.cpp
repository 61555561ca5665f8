// `tandem train`: the seeds' training program. This file is only the table of flags, bound to the library's
// option structs; the program is apps/program/training_program.h. Launch it once per rank, e.g.
//   tandem run --nproc-per-node 2 -- tandem train --epochs 10
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "apps/backend_flag.h"
#include "apps/command.h"
#include "apps/flag_checks.h"
#include "apps/model_flag.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/sharded_safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/monitor/timeline.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"
#include "tandem/util/needs.h"
#include "apps/program/training_program.h"

namespace tandem::app {
namespace {

// Upper bounds of the flags whose type allows far more than a run can use: a value past them fails, if at all,
// deep inside LibTorch (an allocation, a thread pool), long after the command line was read.
//
// A classifier head holds features x classes weights (512 x 100000 for a ResNet: 200 MB, times three with its
// gradient and momentum); the largest common classification sets have about 22000 classes (ImageNet-21k).
constexpr int64_t kMostClasses = 100000;
// Each intra-op thread and each DataParallel CPU replica is an OS thread (a replica also a copy of the model):
// more than the cores of any one machine.
constexpr int kMostThreads = 1024;
// Below a second the ranks cannot count on connecting: gloo's rendezvous gave up "after 0 s" at 0.001.
constexpr double kShortestTimeoutSeconds = 1;

// --init's source. A folder of neither kind opens for reading as a file does, and was then read as one of 2^63
// bytes.
CLI::Validator weights_source() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (!std::filesystem::is_directory(path) || checkpoint::is_distributed_checkpoint(path) ||
            checkpoint::is_sharded_safetensors(path)) {
          return {};
        }
        return fmt::format("{} is a folder of neither a PyTorch distributed checkpoint (.metadata) nor sharded "
                           "safetensors; give weights written by --save-weights, a run dir's "
                           "checkpoint-*.safetensors, or such a folder",
                           path);
      },
      "");
}

struct TrainFlags {
  TrainingProgramOptions options;
  std::string normalize;
  int threads = 0;
  // --device, --backend and --timeout; the program computes where it can ("auto"), the library on the CPU.
  InitOptions init = [] {
    InitOptions defaults;
    defaults.device = "auto";
    return defaults;
  }();
  std::string precision = "32";
  std::string strategy = "ddp";
  std::string checkpoint_format = "full";
  bool no_shuffle = false;
  std::string timeline_steps = "6-25";
  bool no_tensorboard = false;
  bool no_report = false;
  // Whether these were given: --strategy fsdp refuses the first and keeps the loop's check off, and the second
  // needs --strategy fsdp.
  CLI::Option* check_replicas_every = nullptr;
  CLI::Option* reshard_after_forward = nullptr;
  // Flags that only shape what another flag turns on: given without it they would do nothing, so they are refused.
  std::vector<CLI::Option*> powersgd;  // --comm-hook powersgd
  CLI::Option* timeline_steps_flag = nullptr;  // --timeline
  // Hyper-parameters of some optimizers only.
  CLI::Option* momentum = nullptr;  // sgd, rmsprop
  CLI::Option* betas = nullptr;     // adam, adamw
  CLI::Option* eps = nullptr;       // adam, adamw, rmsprop
};

// The refusals that depend on which flags were given, not only on their values.
void check_given_flags(TrainFlags& flags) {
  const train::LoopOptions& loop = flags.options.loop;
  for (const CLI::Option* option : flags.powersgd) {
    if (option->count() > 0 && loop.comm_hook != "powersgd") {
      throw InvalidArgument(only_read_with(option->get_name(), "--comm-hook powersgd"));
    }
  }
  if (flags.timeline_steps_flag->count() > 0 && loop.timeline_path.empty()) {
    throw InvalidArgument("--timeline-steps chooses the steps that --timeline records; add --timeline FILE or drop "
                          "--timeline-steps");
  }
  const std::string& optimizer = flags.options.optimizer;
  const bool adam = optimizer == "adam" || optimizer == "adamw";
  if (flags.momentum->count() > 0 && adam) {
    throw InvalidArgument("--momentum is sgd's and rmsprop's; --optimizer " + optimizer + " averages by --betas");
  }
  if (flags.betas->count() > 0 && !adam) {
    throw InvalidArgument("--betas is adam's and adamw's; --optimizer " + optimizer + " has none: drop --betas");
  }
  if (flags.eps->count() > 0 && optimizer == "sgd") {
    throw InvalidArgument("--eps is adam's, adamw's and rmsprop's; --optimizer sgd has none: drop --eps");
  }
  if (flags.options.strict && flags.options.init_weights.empty()) {
    throw InvalidArgument("--strict checks the weights that --init loads; add --init FILE or drop --strict");
  }
  if (flags.strategy == "dp" && flags.check_replicas_every->count() > 0) {
    throw InvalidArgument("--check-replicas-every compares the ranks' replicas, and --strategy dp trains one process "
                          "whose replicas are copied from its model at every step: drop --check-replicas-every");
  }
  const bool fsdp = flags.strategy == "fsdp";
  if (!fsdp && flags.reshard_after_forward->count() > 0) {
    throw InvalidArgument(
        needs("--reshard-after-forward", "--strategy fsdp", "only fsdp's ranks free gathered parameters"));
  }
  if (!fsdp) return;
  if (flags.check_replicas_every->count() > 0) {
    throw InvalidArgument("--check-replicas-every compares whole replicas, and --strategy fsdp's ranks hold "
                          "different shards of the model: drop --check-replicas-every");
  }
  flags.options.loop.ddp.check_replicas_every = 0;
}

// OMP_NUM_THREADS where it is set to a number (as torchrun sets it), else 0. Held to --threads' range: a pool of
// 100000 threads never finished starting.
int threads_from_environment() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  const long long threads = value ? std::strtoll(value, nullptr, 10) : 0;
  if (threads > kMostThreads) {
    throw InvalidArgument(fmt::format("OMP_NUM_THREADS={} asks for more intra-op threads than the {} a process may "
                                      "have; set it lower, or pass --threads",
                                      value, kMostThreads));
  }
  return static_cast<int>(std::max(threads, 0LL));
}

// The environment's count, else the cores shared evenly among this node's ranks.
int default_threads(int environment_threads, int local_world_size) {
  if (environment_threads > 0) return environment_threads;
  return std::max(1, torch::get_num_threads() / std::max(1, local_world_size));
}

// Threads beyond the node's cores only take turns on them, each step paying for the switches; a shared machine's
// user may still mean it, so the run goes on, after one line (from each node's first rank) that says so.
void warn_threads_beyond_cores(int threads, const char* source, const comm::RankLayout& layout) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (layout.local_rank != 0 || static_cast<int64_t>(threads) * layout.local_world_size <= cores) return;
  log::warn("{} gives each of this node's {} rank{} {} intra-op threads, {} in all on its {} cores: the threads beyond "
            "the cores only take turns and slow every step; give --threads {} or fewer",
            source, layout.local_world_size, layout.local_world_size == 1 ? "" : "s", threads,
            static_cast<int64_t>(threads) * layout.local_world_size, cores,
            std::max(1, cores / layout.local_world_size));
}

int run_train(TrainFlags& flags) {
  train::LoopOptions& loop = flags.options.loop;
  loop.shuffle = !flags.no_shuffle;
  loop.tensorboard = !flags.no_tensorboard;
  loop.report = !flags.no_report;
  loop.timeline_steps = monitor::parse_step_window(flags.timeline_steps);
  loop.precision = amp::parse_precision(flags.precision);
  loop.strategy = train::parse_strategy(flags.strategy);
  loop.checkpoint_format = checkpoint::parse_checkpoint_format(flags.checkpoint_format);
  loop.in_job_recovery = comm::in_job_recovery_requested();
  check_given_flags(flags);
  if (!flags.normalize.empty()) flags.options.data.normalization = data::parse_normalization(flags.normalize);
  // Before the rendezvous: every rank refuses alike, and none waits for a peer to learn that its flags are wrong.
  validate(flags.options);
  const int environment_threads = flags.threads > 0 ? 0 : threads_from_environment();

  ProcessGroup& group = init_process_group(flags.init);
  const int threads =
      flags.threads > 0 ? flags.threads : default_threads(environment_threads, group.layout().local_world_size);
  if (flags.threads > 0 || environment_threads > 0) {
    warn_threads_beyond_cores(threads, flags.threads > 0 ? "--threads" : "OMP_NUM_THREADS", group.layout());
  }
  torch::set_num_threads(threads);
  loop.device = group.device();
  try {
    run_training(flags.options, group.communicator_ptr());
  } catch (...) {
    destroy_process_group();
    throw;
  }
  destroy_process_group();
  return 0;
}

const CommandRegistration kRegisterTrain("train", "train a model on MNIST files or an image folder across the ranks", [](CLI::App& command) {
  auto flags = std::make_shared<TrainFlags>();
  TrainingProgramOptions& p = flags->options;
  data::DataFolderOptions& d = p.data;
  train::LoopOptions& o = p.loop;
  command.add_option("--data", d.dir, "MNIST-format folder (train-/t10k- images and labels, .gz or plain), or an image folder (one sub-folder of .jpg/.png per class)")->capture_default_str();
  command.add_option("--model", p.model, fmt::format("model to train: {}", fmt::join(registered_model_names(), ", ")))->capture_default_str()->check(registered_model());
  command.add_option("--num-classes", d.num_classes, "classifier outputs (default: 10 for MNIST files, whose labels must then be 0-9; for an image folder, its number of class folders)")->check(between<int64_t>(1, kMostClasses));
  command.add_flag("--sync-bn", p.sync_bn, "SyncBatchNorm: BatchNorm statistics over all ranks' batches");
  command.add_option("--image-size", d.image_size, "image folders: training resolution (default 224); MNIST files keep 28")->check(between<int64_t>(1, kLargestImageSize));
  command.add_option("--val-split", d.val_split, "image folders: fraction of each class held out for evaluation (default 0.2)")->check(between(0, 0.99));
  command.add_option("--min-crop-scale", d.min_crop_scale, "image folders: smallest random crop, as a fraction of the image area (default: 0.08*(224/SIZE)^2 within [0.08, 1]: 0.08 at 224, 1 at 32)")->check(between(0.01, 1));
  command.add_flag("--skip-bad-images", d.skip_bad_images, "image folders: drop unreadable images and count them, instead of stopping");
  command.add_option("--epochs", o.epochs, "training epochs")->capture_default_str()->check(at_least<int>(1));
  command.add_option("--batch-size", o.batch_size, "samples per batch per process (a continued run may change it, and the world size: it goes on at the same sample of the epoch)")->capture_default_str()->check(at_least<int64_t>(1));
  // The rate and the weight decay become float32 scalars on float32 weights: past float32's range none can be one.
  command.add_option("--lr", p.lr, "learning rate, multiplied by the global batch (world size x --batch-size) over the run's first --batch-size: the world size, unless a continued run changed the global batch")->capture_default_str()->check(greater_than<float>(0));
  // A fraction, as the name says: below 0 the rate turns negative (gradient ascent), above 1 it would rise.
  command.add_option("--lrf", o.lrf, "final lr as a fraction of --lr, 0 to 1 (cosine schedule per epoch; 1: a constant rate)")->capture_default_str()->check(between(0, 1));
  // At 1 the velocity never decays: every step adds all the gradients seen so far, and the steps grow without end.
  command.add_option("--optimizer", p.optimizer, "sgd (the seeds'), adam, adamw (decoupled weight decay) or rmsprop: LibTorch's, with PyTorch's formulas")->capture_default_str()->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop"}));
  flags->momentum = command.add_option("--momentum", p.momentum, "momentum of sgd and rmsprop")->capture_default_str()->check(at_least_and_below(0, 1));
  command.add_option("--weight-decay", p.weight_decay, "weight decay (adamw: decoupled, as PyTorch's AdamW)")->capture_default_str()->check(at_least<float>(0));
  flags->betas = command.add_option("--betas", p.betas, "B1,B2: adam's and adamw's averaging coefficients")->delimiter(',')->expected(2)->capture_default_str()->check(at_least_and_below(0, 1));
  flags->eps = command.add_option("--eps", p.eps, "adam's, adamw's and rmsprop's term added to the denominator")->capture_default_str()->check(greater_than<float>(0));
  command.add_flag("--zero", p.zero, "ZeroRedundancyOptimizer: each rank keeps the SGD state of its share of the parameters only (about 1/world) and broadcasts them after each step; checkpoints hold the whole state");
  command.add_option("--steps", o.max_steps, "stop after this many optimizer steps (0: all epochs)")->capture_default_str()->check(at_least<int64_t>(0));
  command.add_option("--seed", o.seed, "sampler seed (as PyTorch's DistributedSampler) and initial weights")->capture_default_str()->check(at_least<uint64_t>(0));
  command.add_flag("--uneven", o.uneven_inputs, "every training sample once per epoch: no padding to a multiple of the ranks and no dropped last batch; a rank out of batches answers the others' steps with zero gradients (Join), and each step averages over the ranks that trained");
  command.add_option("--accumulate-batches", o.accumulate_batches, "batches per optimizer step: all but the last under no_sync (gradients add up locally), each loss divided by their count, so a step trains on their mean as on one batch that many times larger")->capture_default_str()->check(at_least<int64_t>(1));
  command.add_option("--comm-hook", o.comm_hook, "how DDP reduces gradients between processes: average, fp16 or bf16 (compressed to 16 bits on the wire), powersgd (low-rank compression with error feedback)")->capture_default_str()->check(CLI::IsMember(ddp::comm_hook_names()));
  flags->powersgd.push_back(command.add_option("--powersgd-rank", o.powersgd.matrix_approximation_rank, "--comm-hook powersgd: rank of each gradient's approximation (PyTorch's matrix_approximation_rank)")->capture_default_str()->check(at_least<int64_t>(1)));
  flags->powersgd.push_back(command.add_option("--powersgd-start", o.powersgd.start_powersgd_iter, "--comm-hook powersgd: steps of plain averaging before compression (PyTorch's start_powerSGD_iter, at least 2)")->capture_default_str()->check(at_least<int64_t>(2)));
  command.add_flag("--no-shuffle", flags->no_shuffle, "rank r takes samples r, r+W, r+2W, ... in order");
  command.add_option("--normalize", flags->normalize, "MNIST: MEAN,STD of the pixels (default: from the folder name; Fashion-MNIST 0.2860,0.3530)")->check(parsed_by(data::parse_normalization, "MEAN,STD of finite numbers with STD above 0 (e.g. 0.2860,0.3530)"));
  command.add_option("--threads", flags->threads, "intra-op threads per process (0, the default: OMP_NUM_THREADS, else cores / local ranks)")->check(between<int>(0, kMostThreads));
  command.add_option("--init,--weights", p.init_weights, "the weights to start from (mismatched tensors are skipped and listed): a safetensors file (--save-weights, a PyTorch state dict), sharded safetensors (a folder, or its model.safetensors.index.json), a tandem checkpoint, full or sharded, or a PyTorch distributed checkpoint (DCP folder; its model, under model. where it holds model and optimizer)")->check(weights_source());
  command.add_flag("--strict", p.strict, "--init must match the model exactly");
  command.add_flag("--init-optimizer", p.init_optimizer, "also continue the optimizer's state (moments, step counts) from --init, a PyTorch distributed checkpoint saved as {\"model\": ..., \"optimizer\": ...} (get_state_dict's layout, torchtitan's); refused where its optimizer or hyper-parameters (all but the learning rate) differ from this run's");
  command.add_flag("--freeze-layers", p.freeze_layers, "train only the classifier head (fc for ResNet)");
  command.add_option("--save-weights", p.save_weights, "write the final weights as safetensors (PyTorch names); a path ending in / writes a new folder of sharded safetensors with model.safetensors.index.json, as Hugging Face publishes large models");
  command.add_option("--run-dir", o.run_dir, "checkpoints and metrics.jsonl (default: runs/<timestamp>, or runs/<run id> under tandem run, shared by its restarts); a run dir that holds a checkpoint is continued from its newest one");
  command.add_flag("--resume", o.resume, "continue the newest run under runs/ (with --run-dir: fail unless it holds a checkpoint), on any world size and --batch-size; --seed, --epochs, --no-shuffle and the data must stay");
  command.add_option("--checkpoint-every", o.checkpoint_every, "also write a checkpoint every this many steps inside an epoch, holding the sampler's position (0: at epoch ends only)")->capture_default_str()->check(at_least<int64_t>(0));
  command.add_option("--keep-checkpoints", o.keep_checkpoints, "keep the newest this many checkpoints in the run dir (0: all)")->capture_default_str()->check(at_least<int>(0));
  command.add_option("--checkpoint-format", flags->checkpoint_format, "full (one file, the whole state gathered and written by rank 0) or sharded (--strategy fsdp: each rank writes its own shards' file, rank 0 an index; no rank gathers the model); either continues on any world size, and a ddp run continues a sharded one too")->capture_default_str()->check(CLI::IsMember({"full", "sharded"}));
  flags->check_replicas_every = command.add_option("--check-replicas-every", o.ddp.check_replicas_every, "compare the ranks' weights every this many steps and stop if they differ (0: never; not with --strategy fsdp)")->capture_default_str()->check(at_least<int64_t>(0));
  command.add_option("--device", flags->init.device, "cpu, cuda (GPU LOCAL_RANK) or auto (cuda where a GPU is visible)")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  command.add_option("--precision", flags->precision, "32, bf16-mixed (autocast to bfloat16) or 16-mixed (float16 with loss scaling); weights stay float32 (--strategy fsdp: the shards stay float32 and the gathered copies it computes on are bfloat16 or float16)")->capture_default_str()->check(CLI::IsMember({"32", "bf16-mixed", "16-mixed"}));
  command.add_option("--strategy", flags->strategy, "ddp (DistributedDataParallel: one process per device, under tandem run), dp (DataParallel: one process, the model replicated in threads; --batch-size is then the whole batch) or fsdp (fully sharded: one process per device, each rank holding 1/world of the parameters, gradients and SGD state, each child module of the model a unit; checkpoints hold the full state unless --checkpoint-format sharded; with --precision bf16-mixed or 16-mixed it computes on bfloat16 or float16 parameters gathered from float32 shards and reduces gradients in float32)")->capture_default_str()->check(CLI::IsMember({"ddp", "dp", "fsdp"}));
  flags->reshard_after_forward = command.add_option("--reshard-after-forward", o.fsdp.reshard_after_forward, "--strategy fsdp: true frees each unit's gathered parameters after its forward and gathers them again in backward (ZeRO-3); false keeps them until backward (more memory, one all-gather fewer)")->default_str("true")->check(true_or_false());
  command.add_option("--dp-replicas", p.dp_replicas, "--strategy dp: replicas (default: every visible GPU with --device cuda, else one per intra-op thread)")->check(between<int>(1, kMostThreads));
  command.add_flag("--no-tensorboard", flags->no_tensorboard, "do not write TensorBoard's event file into the run dir (loss, accuracy, learning_rate, samples_per_second per epoch; step/loss, step/learning_rate per step)");
  command.add_flag("--no-report", flags->no_report, "do not write RUN_DIR/report.html at the end (tandem report RUN_DIR draws it any time)");
  command.add_option("--timeline", o.timeline_path, "write a Chrome trace (Perfetto, chrome://tracing) of --timeline-steps to this file: per rank forward, backward, each bucket's all-reduce, the wait for them and the optimizer step; the means go to RUN_DIR/timeline_summary.json");
  flags->timeline_steps_flag = command.add_option("--timeline-steps", flags->timeline_steps, "FIRST-LAST: the optimizer steps (1-based) the timeline records")->capture_default_str()->check(parsed_by(monitor::parse_step_window, "FIRST-LAST with 1 <= FIRST <= LAST (e.g. 6-25)"));
  command.add_option("--backend", flags->init.backend, backend_flag_help("--device resolves"));
  // Seconds on the command line, milliseconds in the options.
  const auto set_timeout = [flags](double seconds) { flags->init.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); };
  command.add_option_function<double>("--timeout", set_timeout, "seconds before a rendezvous or collective gives up (at least 1, for the ranks to connect; at most a year)")->default_str(std::to_string(std::chrono::seconds(kDefaultTimeout).count()))->check(between(kShortestTimeoutSeconds, double{kLongestTimeoutSeconds}));
  return [flags] { return run_train(*flags); };
});

}  // namespace
}  // namespace tandem::app
