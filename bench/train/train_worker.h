#pragma once
// One worker of `tandem bench train`, started by the driver (train_driver.h) as this program with its options as
// one document (bench/harness/worker_options.h): a rank of the DDP or FSDP job (it joins the process group from
// the environment), one independent process (LOCAL_RANK picks its GPU) or the DataParallel process. Rank 0
// writes the TrainBenchResult as JSON to result_path.
#include <nlohmann/json.hpp>
#include <string>

#include "bench/train/train_bench.h"

namespace tandem::bench {

struct TrainWorkerOptions {
  std::string mode;  // ddp, fsdp (with bench.fsdp), independent or data-parallel
  int replicas = 1;  // data-parallel only
  std::string result_path;
  std::string device;  // cpu or cuda, resolved by the driver; the worker picks its own GPU
  std::string backend;
  int threads = 1;
  TrainBenchOptions bench;  // its devices are the worker's to pick, from `device`; they are not in the document
};

void to_json(nlohmann::json& document, const TrainWorkerOptions& options);
void from_json(const nlohmann::json& document, TrainWorkerOptions& options);

void run_train_worker(TrainWorkerOptions options);

}  // namespace tandem::bench
