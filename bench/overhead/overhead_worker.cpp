#include "bench/overhead/overhead_worker.h"

#include <torch/torch.h>

#include <fstream>

#include "tandem/comm/process_group.h"

namespace tandem::bench {

void run_overhead_worker(const OverheadWorkerOptions& options) {
  torch::set_num_threads(1);
  comm::CommunicatorPtr communicator;
  if (options.mode == "ddp") {
    InitOptions init;
    init.backend = options.backend;
    communicator = init_process_group(init).communicator_ptr();
  }
  const OverheadBenchResult result = run_overhead_bench(options.bench, communicator);
  if (!communicator || is_main_process()) {
    const nlohmann::json json = {
        {"us_per_step_median", result.us_median}, {"repeats", result.us_per_step}, {"allreduce_us", result.allreduce_us}};
    std::ofstream(options.result_path) << json.dump() << "\n";
  }
  communicator.reset();
  if (is_initialized()) destroy_process_group();
}

}  // namespace tandem::bench
