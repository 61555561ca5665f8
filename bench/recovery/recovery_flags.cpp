// `tandem bench recovery`: what a lost worker costs under `tandem run --recovery restart` and `--recovery in-job`,
// side by side on loopback (bench/recovery/recovery_bench.h).
//   tandem bench recovery [--ranks 2,3,4] [--model cnn] [--steps 300] [--kill-after 100] [--checkpoint-every 20]
//                         [--rounds 1] [--data DIR] [--compare torchft]
#include <filesystem>
#include <memory>

#include "apps/flag_checks.h"
#include "apps/model_flag.h"
#include "bench/bench_commands.h"
#include "bench/recovery/recovery_bench.h"
#include "tandem/util/error.h"

namespace tandem::app {
namespace {

int run_bench_recovery(bench::RecoveryBenchOptions& options) {
  if (options.kill_after >= options.steps) {
    throw InvalidArgument(fmt::format("--kill-after {} must be below --steps {}: the kill comes inside the run",
                                      options.kill_after, options.steps));
  }
  options.program = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<bench::RecoveryRun> runs = bench::run_recovery_bench(options);
  bench::print_recovery_table(runs, options);
  return 0;
}

const CommandRegistration kBenchRecovery{
    bench_commands(),
    "recovery",
    "A worker SIGKILLed mid-run under tandem run --recovery restart and in-job, side by side: the time from the "
    "kill to the first new step, the steps trained again, and the time back at full size",
    [](CLI::App& command) -> std::function<int()> {
      auto options = std::make_shared<bench::RecoveryBenchOptions>();
      options->data_dir = "/usr/share/datasets/fashion-mnist";
      command.add_option("--data", options->data_dir, "MNIST-format folder the jobs train on")->capture_default_str();
      command.add_option("--model", options->model, "Model every job trains")->capture_default_str()->check(registered_model());
      command.add_option("--ranks", options->ranks, "Worker counts, one job per count and recovery: e.g. 2,3,4")
          ->delimiter(',')
          ->capture_default_str()
          ->check(between<int>(2, 64));
      command.add_option("--batch-size", options->batch_size, "Samples per batch per worker")
          ->capture_default_str()
          ->check(at_least<int64_t>(1));
      command.add_option("--steps", options->steps, "Optimizer steps each job trains")
          ->capture_default_str()
          ->check(at_least<int64_t>(2));
      command.add_option("--kill-after", options->kill_after, "Rank 1 is SIGKILLed once rank 0 recorded this step")
          ->capture_default_str()
          ->check(at_least<int64_t>(1));
      command.add_option("--checkpoint-every", options->checkpoint_every,
                         "Steps between the checkpoints a restart continues from")
          ->capture_default_str()
          ->check(at_least<int64_t>(1));
      command
          .add_option_function<std::string>(
              "--compare", [options](const std::string&) { options->compare_torchft = true; },
              "torchft: the same job on PyPI's TorchFT beside them (one replica group per rank, its lighthouse on "
              "loopback; bench/recovery/torchft_recovery.py, from .venv)")
          ->check(CLI::IsMember({"torchft"}));
      command.add_option("--torchft-script", options->torchft_script, "--compare torchft: the side script")
          ->capture_default_str();
      command.add_option("--rounds", options->rounds, "Rounds of every job, side by side; the table holds medians")
          ->capture_default_str()
          ->check(between<int>(1, 100));
      return [options]() -> int { return run_bench_recovery(*options); };
    }};

}  // namespace
}  // namespace tandem::app
