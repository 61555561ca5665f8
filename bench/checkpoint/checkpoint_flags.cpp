// `tandem bench checkpoint`: write and read throughput of a PyTorch distributed checkpoint of a large model, beside
// PyTorch's own dcp.save and dcp.load (bench/checkpoint/checkpoint_bench.h).
//   tandem bench checkpoint --mlp-params 250M --rounds 3 --compare pytorch
#include <memory>

#include "apps/flag_checks.h"
#include "bench/bench_commands.h"
#include "bench/checkpoint/checkpoint_bench.h"
#include "bench/memory/memory_bench.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::app {
namespace {

struct BenchCheckpointFlags {
  bench::CheckpointBenchOptions bench;
  std::string mlp_parameters = "250M";
  std::string compare;
  const CLI::Option* pytorch_script = nullptr;
};

const CommandRegistration kBenchCheckpoint{
    bench_commands(),
    "checkpoint",
    "Write and read throughput of a distributed checkpoint (DCP) of a large MLP; vs PyTorch's dcp.save and dcp.load",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<BenchCheckpointFlags>();
      bench::CheckpointBenchOptions& o = flags->bench;
      command.add_option("--mlp-params", flags->mlp_parameters,
                         "about this many parameters (K, M, G: 10^3, 10^6, 10^9), float32, in layers of --mlp-width x "
                         "--mlp-width (250M: 1 GB)")
          ->capture_default_str()
          ->check(parsed_by(bench::parse_parameter_count, "a count such as 250M or 1G"));
      command.add_option("--mlp-width", o.mlp_width, "width of each layer")
          ->capture_default_str()
          ->check(between<int64_t>(16, 65536));
      command.add_option("--rounds", o.rounds,
                         "rounds, each timing tandem then PyTorch; the ratios are the medians of the rounds' ratios")
          ->capture_default_str()
          ->check(between<int>(1, 100));
      command.add_option("--dir", o.dir, "folder to write the checkpoints in (default: $TMPDIR or /tmp)");
      command.add_option("--compare", flags->compare, "also time PyTorch's dcp.save and dcp.load: pytorch")
          ->check(CLI::IsMember({"pytorch"}));
      flags->pytorch_script =
          command.add_option("--pytorch-script", o.pytorch_script, "--compare pytorch: the side script")
              ->capture_default_str();
      return [flags]() -> int {
        if (flags->pytorch_script->count() > 0 && flags->compare.empty()) {
          throw InvalidArgument(only_read_with("--pytorch-script", "--compare pytorch"));
        }
        flags->bench.mlp_parameters = bench::parse_parameter_count(flags->mlp_parameters);
        flags->bench.compare_pytorch = flags->compare == "pytorch";
        bench::run_checkpoint_bench(flags->bench);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
