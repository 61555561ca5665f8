#pragma once
// One worker of `tandem bench overhead`, started by the driver (overhead_driver.h) as this program with its
// options as one document (bench/harness/worker_options.h): the plain process, or a rank of the DDP job (it joins
// the process group from the environment). Rank 0 writes the result to result_path.
#include <nlohmann/json.hpp>
#include <string>

#include "bench/overhead/overhead_bench.h"

namespace tandem::bench {

struct OverheadWorkerOptions {
  std::string mode;     // plain or ddp
  std::string backend;  // ddp: the process group's
  std::string result_path;
  OverheadBenchOptions bench;
};

// The document's fields: every field of both.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OverheadBenchOptions, batch_size, steps, repeats, warmup)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OverheadWorkerOptions, mode, backend, result_path, bench)

void run_overhead_worker(const OverheadWorkerOptions& options);

}  // namespace tandem::bench
