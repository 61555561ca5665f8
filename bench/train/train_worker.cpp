#include "bench/train/train_worker.h"

#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "tandem/comm/process_group.h"
#include "tandem/util/device.h"

namespace tandem::bench {
namespace {

nlohmann::json result_json(const TrainBenchResult& result) {
  return {{"ms_per_step_median", result.ms_median}, {"ms_per_step_min", result.ms_min},
          {"ms_per_step_max", result.ms_max},       {"repeats", result.ms_per_step},
          {"allreduce_ms", result.allreduce_ms},    {"parameters", result.parameters},
          {"hidden_share", result.hidden_share},    {"bytes_per_step", result.bytes_per_step}};
}

// Each field of the document once, for both directions: `visit(name, field)` writes or reads it. Of the
// wrappers' options, the fields the bench sets; the others keep their defaults on both sides.
template <typename Options, typename Visit>
void visit_fields(Options& options, Visit&& visit) {
  visit("mode", options.mode);
  visit("replicas", options.replicas);
  visit("result_path", options.result_path);
  visit("device", options.device);
  visit("backend", options.backend);
  visit("threads", options.threads);
  auto& bench = options.bench;
  visit("model", bench.model);
  visit("image_size", bench.image_size);
  visit("batch_size", bench.batch_size);
  visit("steps", bench.steps);
  visit("repeats", bench.repeats);
  visit("warmup", bench.warmup);
  visit("lr", bench.lr);
  visit("seed", bench.seed);
  visit("bucket_cap_mb", bench.ddp.bucket_cap_mb);
  visit("first_bucket_cap_mb", bench.ddp.first_bucket_cap_mb);
  visit("gradient_as_bucket_view", bench.ddp.gradient_as_bucket_view);
  visit("comm_hook", bench.comm_hook);
  visit("powersgd_matrix_approximation_rank", bench.powersgd.matrix_approximation_rank);
  visit("powersgd_start_powersgd_iter", bench.powersgd.start_powersgd_iter);
  visit("powersgd_min_compression_rate", bench.powersgd.min_compression_rate);
  visit("powersgd_use_error_feedback", bench.powersgd.use_error_feedback);
  visit("powersgd_warm_start", bench.powersgd.warm_start);
  visit("powersgd_orthogonalization_epsilon", bench.powersgd.orthogonalization_epsilon);
  visit("powersgd_random_seed", bench.powersgd.random_seed);
}

}  // namespace

void to_json(nlohmann::json& document, const TrainWorkerOptions& options) {
  document = nlohmann::json::object();
  visit_fields(options, [&](const char* name, const auto& field) { document[name] = field; });
  document["bucket_plan"] = options.bench.ddp.bucket_plan == ddp::BucketPlan::kCaps ? "caps" : "adapt";
  // null: DDP. Of FSDP's options the bench sets reshard_after_forward alone.
  document["fsdp_reshard_after_forward"] =
      options.bench.fsdp ? nlohmann::json(options.bench.fsdp->reshard_after_forward) : nlohmann::json();
}

void from_json(const nlohmann::json& document, TrainWorkerOptions& options) {
  visit_fields(options, [&](const char* name, auto& field) { document.at(name).get_to(field); });
  options.bench.ddp.bucket_plan =
      document.at("bucket_plan") == "caps" ? ddp::BucketPlan::kCaps : ddp::BucketPlan::kAdaptToHost;
  options.bench.fsdp.reset();
  if (const nlohmann::json& reshard = document.at("fsdp_reshard_after_forward"); !reshard.is_null()) {
    options.bench.fsdp.emplace().reshard_after_forward = reshard.get<bool>();
  }
}

void run_train_worker(TrainWorkerOptions options) {
  // The independent workers are started in the background of `sh -c`, which starts them with SIGINT ignored:
  // Ctrl-C must stop them as it stops the other workers, so that the driver sees them fail and ends.
  std::signal(SIGINT, SIG_DFL);
  int threads = options.threads;
  TrainBenchOptions& bench = options.bench;
  comm::CommunicatorPtr communicator;
  if (options.mode == "ddp" || options.mode == "fsdp") {
    InitOptions init;
    init.device = options.device;
    init.backend = options.backend;
    ProcessGroup& group = init_process_group(init);
    bench.device = group.device();
    communicator = group.communicator_ptr();
    if (communicator->world_size() < 2) communicator = nullptr;
  } else if (options.mode == "data-parallel") {
    // Replica k where rank k of the DDP job would be; the process gets the threads of all N ranks, so each
    // replica's thread has one rank's (DataParallel shares them out) and the backward has all of them.
    for (int k = 0; k < options.replicas; ++k) bench.data_parallel_devices.push_back(select_device(options.device, k));
    bench.device = bench.data_parallel_devices.front();
    make_current(bench.device);
    threads *= options.replicas;
  } else {
    // Independent workers are started with LOCAL_RANK set, so that each takes the GPU a rank would.
    const char* local_rank = std::getenv("LOCAL_RANK");
    bench.device = select_device(options.device, local_rank ? std::atoi(local_rank) : 0);
    make_current(bench.device);
  }
  torch::set_num_threads(threads);
  TrainBenchResult result = run_train_bench(bench, communicator);
  if (is_main_process()) std::ofstream(options.result_path) << result_json(result).dump() << "\n";
  if (is_initialized()) destroy_process_group();
}

}  // namespace tandem::bench
