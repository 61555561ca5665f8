#pragma once
// One rank of a `tandem bench memory` job, started by the driver (memory_driver.h) through `tandem run` as this
// program with its options as one document (bench/harness/worker_options.h): it joins the process group from the
// environment (a world of one without `tandem run`), runs the measurement of memory_bench.h and writes its result
// to `result_prefix` + "_<rank>.json".
#include <nlohmann/json.hpp>
#include <string>

#include "bench/memory/memory_bench.h"

namespace tandem::bench {

struct MemoryWorkerOptions {
  MemoryBenchOptions bench;
  std::string result_prefix;
  int threads = 1;  // intra-op threads
};

// The document's fields: every field of both.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryBenchOptions, strategy, model, mlp_parameters, mlp_width, image_size,
                                   batch_size, steps, reshard_after_forward, seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryWorkerOptions, bench, result_prefix, threads)

void run_memory_worker(const MemoryWorkerOptions& options);

}  // namespace tandem::bench
