// `tandem bench`: benchmarks that print tables (and JSON with --json). This file is only the tables of flags;
// the benchmarks live in tandem/bench/ (docs/benchmarks.md).
//   tandem run --nproc-per-node 2 -- tandem bench allreduce              (gloo, run as every rank)
//   mpirun -np 2 tandem bench allreduce --backend mpi                     (mpi, run as every rank)
//   tandem bench train [--backend mpi] [--compare pytorch]                (starts its own processes)
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "apps/command.h"
#include "apps/flag_checks.h"
#include "bench/allreduce_bench.h"
#include "bench/allreduce_command.h"
#include "bench/train_driver.h"
#include "tandem/comm/backend.h"
#include "tandem/util/error.h"

namespace tandem::app {
namespace {

struct BenchTrainFlags {
  bench::TrainDriverOptions driver;
  std::string world_sizes = "1,2";
  std::string compare;
  // Internal: set when this process is one of the workers the driver started.
  std::string worker_mode;
  std::string bucket_plan = "adapt";
  int replicas = 1;  // of a data-parallel worker
  std::string result_path;
};

// How the driver starts a worker: this program's `bench train` with the flags that shape the measurement.
std::string worker_arguments(const bench::TrainDriverOptions& d, const std::string& mode, int replicas,
                             const std::string& result_path) {
  const auto& o = d.bench;
  return fmt::format(
      "bench train --model {} --image-size {} --device {} --backend {} --batch-size {} --steps {} --repeats {} "
      "--warmup {} --threads {} --bucket-cap-mb {} --first-bucket-cap-mb {} --bucket-plan {}{} --comm-hook {} "
      "--powersgd-rank {} --powersgd-start {} --worker {} --replicas {} --result {}",
      o.model, o.image_size, d.device, d.backend, o.batch_size, o.steps, o.repeats, o.warmup, d.threads,
      o.ddp.bucket_cap_mb, o.ddp.first_bucket_cap_mb, o.ddp.bucket_plan == ddp::BucketPlan::kCaps ? "caps" : "adapt",
      o.ddp.gradient_as_bucket_view ? " --gradient-as-bucket-view" : "",
      o.comm_hook, o.powersgd.matrix_approximation_rank, o.powersgd.start_powersgd_iter, mode, replicas, result_path);
}

int run_bench_train(BenchTrainFlags& flags) {
  bench::TrainDriverOptions& d = flags.driver;
  d.bench.ddp.bucket_plan = flags.bucket_plan == "caps" ? ddp::BucketPlan::kCaps : ddp::BucketPlan::kAdaptToHost;
  if (!flags.worker_mode.empty()) {
    bench::run_train_worker({flags.worker_mode, flags.replicas, flags.result_path, d.device, d.backend, d.threads, d.bench});
    return 0;
  }
  if (!flags.compare.empty() && flags.compare != "pytorch") {
    throw InvalidArgument(fmt::format("--compare '{}' is unknown; the only comparison is 'pytorch'", flags.compare));
  }
  d.compare_pytorch = flags.compare == "pytorch";
  d.world_sizes.clear();
  for (int64_t n : bench::parse_sizes(flags.world_sizes)) d.world_sizes.push_back(static_cast<int>(n));
  d.program = std::filesystem::read_symlink("/proc/self/exe").string();
  d.worker_arguments = worker_arguments;
  bench::run_train_driver(d);
  return 0;
}

const CommandRegistration kBench{
    "bench", "Benchmarks: all-reduce bandwidth per backend, training steps vs PyTorch DDP", [](CLI::App& command) {
      command.require_subcommand(1);
      auto flags = std::make_shared<bench::AllreduceCommandOptions>();
      CLI::App* allreduce = command.add_subcommand(
          "allreduce", "All-reduce algorithm and bus bandwidth per size, beside the host's memcpy bandwidth");
      allreduce->add_option("--device", flags->device, "Where the buffer lives: cpu, cuda (GPU LOCAL_RANK) or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      allreduce->add_option("--backend", flags->backend, "Communication backend (default: nccl on a GPU, gloo on the CPU)")
          ->check(CLI::IsMember(comm::available_backends()));
      allreduce->add_option("--sizes", flags->sizes, "Sizes in bytes: FIRST..LAST (doubling) or a list A,B,C")
          ->capture_default_str();
      allreduce->add_option("--iters", flags->iters, "Timed all-reduces per size (0: about 2 GB, 5..200)")
          ->capture_default_str();
      allreduce->add_option("--warmup", flags->warmup, "Untimed all-reduces per size")->capture_default_str();
      allreduce->add_option("--memcpy-size", flags->memcpy_size, "Buffer size for the memcpy ceiling")
          ->capture_default_str();
      allreduce->add_option("--json", flags->json_path, "Also write the results as JSON to this file (rank 0)");
      allreduce->add_option("--timeout", flags->timeout_s, "Seconds before a collective counts as hung")
          ->capture_default_str()
          ->check(at_least(1));

      auto train_flags = std::make_shared<BenchTrainFlags>();
      CLI::App* train = command.add_subcommand(
          "train",
          "Training steps per second for world sizes 1 and 2 with DDP and DataParallel, scaling efficiency, overlap; "
          "vs PyTorch DDP");
      train->add_option("--device", train_flags->driver.device, "cpu, cuda or auto (cuda where a GPU is visible)")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      train->add_option("--backend", train_flags->driver.backend, "Communication backend (default: nccl on a GPU, gloo on the CPU)")
          ->check(CLI::IsMember(comm::available_backends()));
      train->add_option("--world-sizes", train_flags->world_sizes, "World sizes to time, e.g. 1,2")
          ->capture_default_str();
      train->add_option("--model", train_flags->driver.bench.model, "Registered model to train (as tandem train --model)")
          ->capture_default_str();
      train->add_option("--image-size", train_flags->driver.bench.image_size, "Square input size (the CNN takes 28)")
          ->capture_default_str();
      train->add_option("--batch-size", train_flags->driver.bench.batch_size, "Samples per process per step")
          ->capture_default_str();
      train->add_option("--steps", train_flags->driver.bench.steps, "Timed steps per repeat")->capture_default_str();
      train->add_option("--repeats", train_flags->driver.bench.repeats, "Timed repeats (median and spread)")
          ->capture_default_str();
      train->add_option("--warmup", train_flags->driver.bench.warmup, "Untimed steps first")->capture_default_str();
      train->add_option("--threads", train_flags->driver.threads, "Intra-op threads per process")->capture_default_str();
      train->add_option("--bucket-cap-mb", train_flags->driver.bench.ddp.bucket_cap_mb,
                        "DDP bucket size in MiB (PyTorch's bucket_cap_mb); larger buckets start communicating later")
          ->capture_default_str()
          ->check(greater_than(0));
      train->add_option("--first-bucket-cap-mb", train_flags->driver.bench.ddp.first_bucket_cap_mb,
                        "Size of the first DDP bucket in MiB, which starts communicating earliest (tandem only: "
                        "PyTorch fixes it at 1)")
          ->capture_default_str()
          ->check(greater_than(0));
      train->add_option("--bucket-plan", train_flags->bucket_plan,
                        "adapt: the caps above, or one bucket reduced at the end of backward where gloo or mpi would "
                        "have no spare core to overlap it on (the ranks' threads take every core); caps: always the caps")
          ->capture_default_str()
          ->check(CLI::IsMember({"adapt", "caps"}));
      train->add_flag("--gradient-as-bucket-view", train_flags->driver.bench.ddp.gradient_as_bucket_view,
                      "Make each .grad a view into its DDP bucket, saving a copy per step (as PyTorch's option)");
      train->add_option("--comm-hook", train_flags->driver.bench.comm_hook,
                        "How DDP reduces each bucket: average, fp16, bf16 or powersgd (low-rank compression; "
                        "PyTorch's comm hooks of the same names)")
          ->capture_default_str()
          ->check(CLI::IsMember({"average", "fp16", "bf16", "powersgd"}));
      // Timed steps come after the warm-up, so compression starts within it by default.
      train_flags->driver.bench.powersgd.start_powersgd_iter = 2;
      train->add_option("--powersgd-rank", train_flags->driver.bench.powersgd.matrix_approximation_rank,
                        "--comm-hook powersgd: rank of each gradient's approximation (PyTorch's "
                        "matrix_approximation_rank)")
          ->capture_default_str()
          ->check(at_least(1));
      train->add_option("--powersgd-start", train_flags->driver.bench.powersgd.start_powersgd_iter,
                        "--comm-hook powersgd: steps of plain averaging before compression (PyTorch's "
                        "start_powerSGD_iter; at least 2)")
          ->capture_default_str()
          ->check(at_least(2));
      train->add_option("--rounds", train_flags->driver.rounds,
                        "Run every measurement this many times, interleaved; figures are medians over rounds and "
                        "ratios are paired within a round (steadier on a noisy machine)")
          ->capture_default_str()
          ->check(at_least(1));
      train->add_option("--compare", train_flags->compare, "Also run PyTorch's Python DDP: 'pytorch'");
      train->add_option("--pytorch-script", train_flags->driver.pytorch_script, "The PyTorch side script")
          ->capture_default_str();
      train->add_option("--json", train_flags->driver.json_path, "Also write the results as JSON to this file");
      train->add_option("--worker", train_flags->worker_mode,
                        "(internal) run as a worker: ddp, independent or data-parallel")
          ->group("");
      train->add_option("--replicas", train_flags->replicas, "(internal) replicas of a data-parallel worker")
          ->group("");
      train->add_option("--result", train_flags->result_path, "(internal) worker result file")->group("");

      return [flags, allreduce, train_flags, train]() -> int {
        if (train->parsed()) return run_bench_train(*train_flags);
        bench::run_allreduce_command(*flags);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
