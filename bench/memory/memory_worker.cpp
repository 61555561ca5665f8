#include "bench/memory/memory_worker.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <csignal>
#include <fstream>

#include "tandem/comm/process_group.h"

namespace tandem::bench {
namespace {

nlohmann::json memory_result_json(const MemoryBenchResult& r) {
  return {{"rank", r.rank},
          {"world_size", r.world_size},
          {"model_parameters", r.model_parameters},
          {"parameter_bytes", r.parameter_bytes},
          {"gradient_bytes", r.gradient_bytes},
          {"optimizer_state_bytes", r.optimizer_state_bytes},
          {"peak_gathered_bytes", r.peak_gathered_bytes},
          {"largest_unit_bytes", r.largest_unit_bytes},
          {"peak_resident_build", r.peak_resident_build},
          {"peak_resident_train", r.peak_resident_train},
          {"ms_per_step", r.ms_per_step}};
}

}  // namespace

void run_memory_worker(const MemoryWorkerOptions& options) {
  // Started by `tandem run` in the background of the driver's shell: Ctrl-C must stop it too.
  std::signal(SIGINT, SIG_DFL);
  torch::set_num_threads(options.threads);
  InitOptions init;
  init.device = "cpu";
  ProcessGroup& group = init_process_group(init);
  const MemoryBenchResult result = run_memory_bench(options.bench, group.communicator_ptr());
  std::ofstream(fmt::format("{}_{}.json", options.result_prefix, result.rank)) << memory_result_json(result).dump() << "\n";
  destroy_process_group();
}

}  // namespace tandem::bench
