// `tandem bench memory`: bytes per rank of parameters, gradients and AdamW state, and peak resident memory, under
// FSDP or DDP at each world size; it starts its own jobs through `tandem run` (bench/memory/memory_driver.h).
//   tandem bench memory --strategy fsdp --world-sizes 4 --mlp-params 600M     the model DDP cannot fit
//   tandem bench memory --strategy fsdp --model resnet18 --world-sizes 1,2,4  bytes per rank against N
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "bench/bench_commands.h"
#include "bench/harness/flag_checks.h"
#include "apps/flag_checks.h"
#include "apps/model_flag.h"
#include "bench/harness/worker_options.h"
#include "bench/memory/memory_driver.h"
#include "bench/memory/memory_worker.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::app {
namespace {

struct BenchMemoryFlags {
  bench::MemoryDriverOptions driver;
  std::string world_sizes = "1,2,4";
  std::string mlp_parameters = "100M";
  std::string worker_options;  // internal: one rank of a job the driver started (bench/memory/memory_worker.h)
  const CLI::Option* reshard = nullptr;
  std::vector<const CLI::Option*> mlp_only;
  const CLI::Option* image_size = nullptr;
};

int run_bench_memory(BenchMemoryFlags& flags) {
  if (!flags.worker_options.empty()) {
    bench::run_memory_worker(bench::read_worker_options<bench::MemoryWorkerOptions>(flags.worker_options));
    return 0;
  }
  bench::MemoryDriverOptions& d = flags.driver;
  d.bench.mlp_parameters = bench::parse_parameter_count(flags.mlp_parameters);
  if (flags.reshard->count() > 0 && d.bench.strategy != "fsdp") {
    throw InvalidArgument(only_read_with("--reshard-after-forward", "--strategy fsdp"));
  }
  for (const CLI::Option* option : flags.mlp_only) {
    if (option->count() > 0 && d.bench.model != "mlp") {
      const std::string& name = option->get_name();
      throw InvalidArgument(
          only_read_with(name, "--model mlp", fmt::format("drop {} to measure --model {}", name, d.bench.model)));
    }
  }
  if (flags.image_size->count() > 0 && d.bench.model == "mlp") {
    throw InvalidArgument("--image-size is not read with --model mlp, which takes vectors; drop --image-size");
  }
  d.world_sizes = bench::parse_world_sizes(flags.world_sizes);
  d.program = std::filesystem::read_symlink("/proc/self/exe").string();
  bench::run_memory_driver(d);
  return 0;
}

const CommandRegistration kBenchMemory{
    bench_commands(),
    "memory",
    "Bytes per rank of parameters, gradients and AdamW state, and peak resident memory, under FSDP or DDP at each "
    "world size; refuses a run that would not fit this host",
    [](CLI::App& command) -> std::function<int()> {
      const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      auto flags = std::make_shared<BenchMemoryFlags>();
      bench::MemoryBenchOptions& o = flags->driver.bench;
      CLI::App* memory = &command;
      memory->add_option("--strategy", o.strategy,
                         "fsdp: tandem::fsdp (each direct child a unit); ddp: DistributedDataParallel (every rank "
                         "holds everything)")
          ->capture_default_str()
          ->check(CLI::IsMember({"fsdp", "ddp"}));
      memory->add_option("--world-sizes", flags->world_sizes, "World sizes to measure, one job each: e.g. 1,2,4")
          ->capture_default_str()
          ->check(bench_world_sizes());
      std::vector<std::string> models{"mlp"};
      for (const std::string& name : registered_model_names()) {
        if (name != "cnn") models.push_back(name);  // the registry's RGB models; the CNN reads 28x28 grayscale
      }
      memory->add_option("--model", o.model,
                         fmt::format("mlp (a wide MLP of --mlp-params parameters, the large-model case) or a model "
                                     "on RGB images: {}",
                                     fmt::join(models, ", ")))
          ->capture_default_str()
          ->check(CLI::IsMember(models));
      flags->mlp_only.push_back(
          memory
              ->add_option("--mlp-params", flags->mlp_parameters,
                           "--model mlp: about this many parameters (K, M, G: 10^3, 10^6, 10^9), in layers of "
                           "--mlp-width x --mlp-width")
              ->capture_default_str()
              ->check(refused_by_parser([](const std::string& text) { bench::parse_parameter_count(text); })));
      flags->mlp_only.push_back(memory->add_option("--mlp-width", o.mlp_width, "--model mlp: width of each layer")
                                    ->capture_default_str()
                                    ->check(between<int64_t>(16, 65536)));
      flags->image_size = memory->add_option("--image-size", o.image_size, "Square RGB input size in pixels")
                              ->capture_default_str()
                              ->check(between<int64_t>(1, kLargestImageSize));
      memory->add_option("--batch-size", o.batch_size, "Samples per rank per step")
          ->capture_default_str()
          ->check(between<int>(1, 4096));
      memory->add_option("--steps", o.steps, "Training steps (AdamW) after the model is built")
          ->capture_default_str()
          ->check(between<int>(1, 1000));
      flags->reshard =
          memory
              ->add_option("--reshard-after-forward", o.reshard_after_forward,
                           "--strategy fsdp: free each unit's gathered parameters after its forward (true, ZeRO-3) "
                           "or keep them until its backward (false)")
              ->default_str("true")
              ->check(true_or_false());
      memory->add_option("--threads", flags->driver.threads, "Intra-op threads per rank, at most the cores")
          ->capture_default_str()
          ->check(between<int>(1, cores));
      memory->add_option("--json", flags->driver.json_path, "Also write every rank's figures as JSON to this file");
      bench::add_worker_options_flag(command, flags->worker_options);
      return [flags]() -> int { return run_bench_memory(*flags); };
    }};

}  // namespace
}  // namespace tandem::app
