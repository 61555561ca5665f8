// `tandem bench overhead`: the host's cost of a training step where compute is negligible, LibTorch alone,
// tandem's DDP per backend and world size, and PyTorch's Python DDP; it starts its own processes
// (bench/overhead/overhead_driver.h).
//   tandem bench overhead [--world-sizes 1,2] [--backends gloo,mpi] [--rounds 3]
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "bench/bench_commands.h"
#include "bench/harness/flag_checks.h"
#include "apps/flag_checks.h"
#include "bench/harness/worker_options.h"
#include "bench/overhead/overhead_driver.h"
#include "bench/overhead/overhead_worker.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::app {
namespace {

struct BenchOverheadFlags {
  bench::OverheadDriverOptions driver;
  std::string world_sizes = "1,2";
  std::string backends;  // empty: the driver's default
  std::string compare = "pytorch";
  const CLI::Option* pytorch_script = nullptr;
  // Internal: set when this process is one of the workers the driver started (bench/overhead/overhead_worker.h).
  std::string worker_options;
};

int run_bench_overhead(BenchOverheadFlags& flags) {
  if (!flags.worker_options.empty()) {
    bench::run_overhead_worker(bench::read_worker_options<bench::OverheadWorkerOptions>(flags.worker_options));
    return 0;
  }
  bench::OverheadDriverOptions& d = flags.driver;
  d.compare_pytorch = flags.compare == "pytorch";
  if (flags.pytorch_script->count() > 0 && !d.compare_pytorch) {
    throw InvalidArgument(
        only_read_with("--pytorch-script", "--compare pytorch", "drop --compare none or --pytorch-script"));
  }
  d.world_sizes = bench::parse_world_sizes(flags.world_sizes);
  if (!flags.backends.empty()) d.backends = bench::parse_overhead_backends(flags.backends);
  d.program = std::filesystem::read_symlink("/proc/self/exe").string();
  bench::run_overhead_driver(d);
  return 0;
}

const CommandRegistration kBenchOverhead{
    bench_commands(),
    "overhead",
    "Host overhead per training step (µs) of a tiny MLP: LibTorch alone, tandem's DDP per backend and world size, "
    "vs PyTorch's Python DDP",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<BenchOverheadFlags>();
      bench::OverheadBenchOptions& b = flags->driver.bench;
      CLI::App* overhead = &command;
      overhead->add_option("--world-sizes", flags->world_sizes, "DDP world sizes to time, processes each: e.g. 1,2")
          ->capture_default_str()
          ->check(bench_world_sizes());
      overhead->add_option("--backends", flags->backends,
                           "Backends of tandem's DDP rows: gloo, mpi or gloo,mpi (default: gloo, and mpi where this "
                           "build has it and mpirun is on PATH); PyTorch's DDP always runs over gloo")
          ->check(refused_by_parser([](const std::string& text) { bench::parse_overhead_backends(text); }));
      overhead->add_option("--batch-size", b.batch_size, "Samples per process per step")
          ->capture_default_str()
          ->check(between<int>(1, 1 << 20));
      overhead->add_option("--steps", b.steps, "Timed steps per repeat")->capture_default_str()->check(at_least<int>(1));
      overhead->add_option("--repeats", b.repeats, "Timed repeats per measurement (their median is its figure)")
          ->capture_default_str()
          ->check(at_least<int>(1));
      overhead->add_option("--warmup", b.warmup, "Untimed steps first")->capture_default_str()->check(at_least<int>(0));
      overhead->add_option("--rounds", flags->driver.rounds,
                           "Run every measurement this many times, interleaved; figures are medians over rounds and "
                           "ratios are paired within a round (steadier on a noisy machine)")
          ->capture_default_str()
          ->check(at_least<int>(1));
      overhead->add_option("--compare", flags->compare,
                           "pytorch: also time PyTorch's Python step, unwrapped and under DDP (python3-torch); none")
          ->capture_default_str()
          ->check(CLI::IsMember({"pytorch", "none"}));
      flags->pytorch_script =
          overhead->add_option("--pytorch-script", flags->driver.pytorch_script, "--compare pytorch: the PyTorch side script")
              ->capture_default_str();
      overhead->add_option("--json", flags->driver.json_path, "Also write the results as JSON to this file");
      bench::add_worker_options_flag(command, flags->worker_options);
      return [flags]() -> int { return run_bench_overhead(*flags); };
    }};

}  // namespace
}  // namespace tandem::app
