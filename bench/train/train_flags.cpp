// `tandem bench train`: training steps per second at each world size, DDP against independent processes and
// DataParallel, and against PyTorch's DDP; it starts its own processes (bench/train/train_driver.h).
//   tandem bench train [--backend mpi] [--compare pytorch]
//   tandem bench train --strategy fsdp [--compare pytorch]: FSDP beside DDP (and PyTorch's FSDP2)
//   tandem bench train --end-to-end [--rounds R]: the main job as a user runs it, vs a lean PyTorch script
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/backend_flag.h"
#include "bench/bench_commands.h"
#include "bench/harness/flag_checks.h"
#include "apps/flag_checks.h"
#include "apps/model_flag.h"
#include "bench/train/end_to_end.h"
#include "bench/harness/worker_options.h"
#include "bench/train/train_driver.h"
#include "bench/train/train_worker.h"
#include "tandem/comm/backend.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::app {
namespace {

struct BenchTrainFlags {
  bench::TrainDriverOptions driver;
  std::string world_sizes = "1,2";
  std::string compare;
  std::string strategy = "ddp";
  bool reshard_after_forward = true;
  std::string bucket_plan = "adapt";
  // Internal: set when this process is one of the workers the driver started (bench/train/train_worker.h).
  std::string worker_options;
  // Flags that only matter beside another one; given without it, they are refused rather than ignored.
  const CLI::Option* pytorch_script = nullptr;
  const CLI::Option* reshard = nullptr;
  std::vector<const CLI::Option*> powersgd;
  // --end-to-end times whole runs of the main job (bench/train/end_to_end.h) and reads only the flags named in
  // end_to_end_reads; its step counts have defaults of their own.
  bool end_to_end = false;
  bench::EndToEndOptions end_to_end_options;
  const CLI::Option* short_steps = nullptr;
};

// The flags --end-to-end reads; any other given beside it is refused rather than ignored.
bool end_to_end_reads(const std::string& name) {
  for (const char* read : {"--end-to-end", "--steps", "--short-steps", "--rounds", "--batch-size", "--threads",
                           "--json", "--pytorch-script"}) {
    if (name == read) return true;
  }
  return false;
}

int run_end_to_end(BenchTrainFlags& flags, const CLI::App& command) {
  for (const CLI::Option* option : command.get_options()) {
    if (option->count() > 0 && !end_to_end_reads(option->get_name())) {
      throw InvalidArgument(fmt::format("{} is not read with --end-to-end, which runs tandem train's defaults; drop {}",
                                        option->get_name(), option->get_name()));
    }
  }
  bench::EndToEndOptions& o = flags.end_to_end_options;
  const bench::TrainDriverOptions& d = flags.driver;
  if (command.count("--steps") > 0) o.steps = d.bench.steps;
  if (command.count("--batch-size") > 0) o.batch_size = d.bench.batch_size;
  if (command.count("--pytorch-script") > 0) o.pytorch_script = d.pytorch_script;
  o.rounds = d.rounds;
  o.threads = d.threads;
  o.json_path = d.json_path;
  o.program = std::filesystem::read_symlink("/proc/self/exe").string();
  bench::run_end_to_end(o);
  return 0;
}

void refuse_flags_without_effect(const BenchTrainFlags& flags) {
  if (flags.pytorch_script->count() > 0 && flags.compare.empty()) {
    throw InvalidArgument(only_read_with("--pytorch-script", "--compare pytorch"));
  }
  if (flags.reshard->count() > 0 && flags.strategy != "fsdp") {
    throw InvalidArgument(only_read_with("--reshard-after-forward", "--strategy fsdp"));
  }
  for (const CLI::Option* option : flags.powersgd) {
    if (option->count() > 0 && flags.driver.bench.comm_hook != "powersgd") {
      throw InvalidArgument(only_read_with(option->get_name(), "--comm-hook powersgd"));
    }
  }
}

int run_bench_train(BenchTrainFlags& flags, const CLI::App& command) {
  if (!flags.worker_options.empty()) {
    bench::run_train_worker(bench::read_worker_options<bench::TrainWorkerOptions>(flags.worker_options));
    return 0;
  }
  if (flags.end_to_end) return run_end_to_end(flags, command);
  if (flags.short_steps->count() > 0) {
    throw InvalidArgument(only_read_with("--short-steps", "--end-to-end"));
  }
  bench::TrainDriverOptions& d = flags.driver;
  d.bench.ddp.bucket_plan = flags.bucket_plan == "caps" ? ddp::BucketPlan::kCaps : ddp::BucketPlan::kAdaptToHost;
  const bool sharded = flags.strategy == "fsdp";
  if (sharded) {
    d.bench.fsdp.emplace();
    d.bench.fsdp->reshard_after_forward = flags.reshard_after_forward;
  }
  refuse_flags_without_effect(flags);
  d.compare_pytorch = flags.compare == "pytorch";
  if (sharded && flags.pytorch_script->count() == 0) d.pytorch_script = "bench/train/pytorch_fsdp_bench.py";
  d.world_sizes = bench::parse_world_sizes(flags.world_sizes);
  d.program = std::filesystem::read_symlink("/proc/self/exe").string();
  bench::run_train_driver(d);
  return 0;
}

// What is measured: where, how many processes, which model and how long.
void add_measurement_flags(CLI::App* train, BenchTrainFlags* train_flags) {
  // Intra-op threads beyond the cores only take turns on them.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  bench::TrainBenchOptions& bench_options = train_flags->driver.bench;
  train->add_option("--device", train_flags->driver.device, "cpu, cuda or auto (cuda where a GPU is visible)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  train->add_option("--backend", train_flags->driver.backend, backend_flag_help("--device resolves"))
      ->check(CLI::IsMember(comm::available_backends()));
  train->add_option("--world-sizes", train_flags->world_sizes, "World sizes to time, processes each: e.g. 1,2")
      ->capture_default_str()
      ->check(bench_world_sizes());
  train->add_option("--model", bench_options.model, fmt::format("Model to train: {}", fmt::join(registered_model_names(), ", ")))
      ->capture_default_str()
      ->check(registered_model());
  train->add_option("--image-size", bench_options.image_size, "Square input size in pixels (the CNN takes 28)")
      ->capture_default_str()
      ->check(between<int64_t>(1, kLargestImageSize));
  train->add_option("--batch-size", bench_options.batch_size, "Samples per process per step")
      ->capture_default_str()
      ->check(at_least<int>(1));
  train->add_option("--steps", bench_options.steps, "Timed steps per repeat")
      ->capture_default_str()
      ->check(at_least<int>(1));
  train->add_option("--repeats", bench_options.repeats, "Timed repeats (median and spread)")
      ->capture_default_str()
      ->check(at_least<int>(1));
  train->add_option("--warmup", bench_options.warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(at_least<int>(0));
  train->add_option("--threads", train_flags->driver.threads, "Intra-op threads per process, at most the cores")
      ->capture_default_str()
      ->check(between<int>(1, cores));
}

// How DDP reduces the gradients.
void add_ddp_flags(CLI::App* train, BenchTrainFlags* train_flags) {
  bench::TrainBenchOptions& bench_options = train_flags->driver.bench;
  train->add_option("--bucket-cap-mb", bench_options.ddp.bucket_cap_mb,
                    "DDP bucket size in MiB (PyTorch's bucket_cap_mb); larger buckets start communicating later")
      ->capture_default_str()
      ->check(between(kBenchSmallestBucketMb, kBenchLargestBucketMb));
  train->add_option("--first-bucket-cap-mb", bench_options.ddp.first_bucket_cap_mb,
                    "Size of the first DDP bucket in MiB, which starts communicating earliest (tandem only: "
                    "PyTorch fixes it at 1)")
      ->capture_default_str()
      ->check(between(kBenchSmallestBucketMb, kBenchLargestBucketMb));
  train->add_option("--bucket-plan", train_flags->bucket_plan,
                    "adapt: the caps above, or one bucket reduced at the end of backward where gloo or mpi would "
                    "have no spare core to overlap it on (the ranks' threads take every core); caps: always the caps")
      ->capture_default_str()
      ->check(CLI::IsMember({"adapt", "caps"}));
  train->add_flag("--gradient-as-bucket-view", bench_options.ddp.gradient_as_bucket_view,
                  "Make each .grad a view into its DDP bucket, saving a copy per step (as PyTorch's option)");
  train->add_option("--comm-hook", bench_options.comm_hook,
                    "How DDP reduces each bucket: average, fp16, bf16 or powersgd (low-rank compression; "
                    "PyTorch's comm hooks of the same names)")
      ->capture_default_str()
      ->check(CLI::IsMember(ddp::comm_hook_names()));
  // Timed steps come after the warm-up, so compression starts within it by default.
  bench_options.powersgd.start_powersgd_iter = 2;
  train_flags->powersgd.push_back(
      train
          ->add_option("--powersgd-rank", bench_options.powersgd.matrix_approximation_rank,
                       "--comm-hook powersgd: rank of each gradient's approximation (PyTorch's "
                       "matrix_approximation_rank)")
          ->capture_default_str()
          ->check(at_least<int64_t>(1)));
  train_flags->powersgd.push_back(
      train
          ->add_option("--powersgd-start", bench_options.powersgd.start_powersgd_iter,
                       "--comm-hook powersgd: steps of plain averaging before compression (PyTorch's "
                       "start_powerSGD_iter; at least 2)")
          ->capture_default_str()
          ->check(at_least<int64_t>(2)));
}

// Rounds, the strategy, what the run is compared with and where its figures go.
void add_comparison_flags(CLI::App* train, BenchTrainFlags* train_flags) {
  train->add_option("--rounds", train_flags->driver.rounds,
                    "Run every measurement this many times, interleaved; figures are medians over rounds and "
                    "ratios are paired within a round (steadier on a noisy machine)")
      ->capture_default_str()
      ->check(at_least<int>(1));
  train->add_option("--strategy", train_flags->strategy,
                    "ddp: DDP (and DataParallel) against independent processes; fsdp: at each world size above "
                    "1, FSDP (tandem::fsdp, each direct child a unit) and DDP side by side in every round")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "fsdp"}));
  train_flags->reshard =
      train
          ->add_option("--reshard-after-forward", train_flags->reshard_after_forward,
                       "--strategy fsdp: free each unit's gathered parameters after its forward (true, ZeRO-3) "
                       "or keep them until its backward (false); PyTorch's side alike")
          ->default_str("true")
          ->check(true_or_false());
  train->add_option("--compare", train_flags->compare,
                    "Also run PyTorch's Python DDP (with --strategy fsdp: FSDP2's fully_shard): pytorch")
      ->check(CLI::IsMember({"pytorch"}));
  train_flags->pytorch_script =
      train->add_option("--pytorch-script", train_flags->driver.pytorch_script,
                        "--compare pytorch: the PyTorch side script (with --strategy fsdp: "
                        "bench/train/pytorch_fsdp_bench.py)")
          ->capture_default_str();
  train->add_option("--json", train_flags->driver.json_path, "Also write the results as JSON to this file");
  train->add_flag("--end-to-end", train_flags->end_to_end,
                  "Time the main job as a user runs it (tandem run --nproc-per-node 2 -- tandem train, every "
                  "default on) against bench/train/pytorch_end_to_end.py, from whole runs of --steps (default 240) "
                  "and --short-steps; reads only those, --rounds, --batch-size, --threads, --json and "
                  "--pytorch-script");
  train_flags->short_steps =
      train->add_option("--short-steps", train_flags->end_to_end_options.short_steps,
                        "--end-to-end: steps of the short run, whose wall time is subtracted from the long "
                        "run's so that start-up cancels")
          ->capture_default_str()
          ->check(at_least<int64_t>(1));
}

const CommandRegistration kBenchTrain{
    bench_commands(),
    "train",
    "Training steps per second for world sizes 1 and 2 with DDP and DataParallel, scaling efficiency, overlap; "
    "vs PyTorch DDP; --strategy fsdp: FSDP beside DDP, vs PyTorch FSDP2",
    [](CLI::App& command) -> std::function<int()> {
      auto train_flags = std::make_shared<BenchTrainFlags>();
      CLI::App* train = &command;
      add_measurement_flags(train, train_flags.get());
      add_ddp_flags(train, train_flags.get());
      add_comparison_flags(train, train_flags.get());
      bench::add_worker_options_flag(command, train_flags->worker_options);
      return [train_flags, train]() -> int { return run_bench_train(*train_flags, *train); };
    }};

}  // namespace
}  // namespace tandem::app
