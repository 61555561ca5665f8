#include "bench/memory/memory_driver.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/harness/child_processes.h"
#include "bench/harness/host.h"
#include "bench/harness/worker_options.h"
#include "bench/memory/memory_worker.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {
namespace {

constexpr int64_t kDdpBytesPerParameter = 16;  // float32 parameter, gradient and AdamW's two moments
// What an FSDP rank holds beyond its shards, their gradients and their state, in units of the largest unit's
// float32 bytes: two gathered units (the one running and the one prefetched), and the one reduction in flight's
// full gradient, its flat copy and the emulated reduce-scatter's buffer. Measured on the wide MLP at 4 ranks over
// LibTorch 1.13's Gloo (BENCHMARKS.md): 5.2 units; one more for margin.
constexpr int64_t kFsdpUnitsBeyondState = 6;

// The largest value of `field` over the ranks of one job.
int64_t largest(const std::vector<nlohmann::json>& ranks, const char* field) {
  int64_t most = ranks.front()[field].get<int64_t>();
  for (const auto& rank : ranks) most = std::max(most, rank[field].get<int64_t>());
  return most;
}

std::string megabytes(int64_t bytes) { return bytes < 0 ? "-" : fmt::format("{:.1f}", static_cast<double>(bytes) / 1e6); }

std::string gigabytes(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") return kilobytes * 1024;
  }
  return host_memory_bytes();
}

int64_t estimated_bytes_per_rank(const MemoryBenchOptions& options, int64_t parameters, int world_size) {
  if (options.strategy == "ddp") return kDdpBytesPerParameter * parameters;
  const int64_t unit_bytes = options.model == "mlp" ? 4 * (options.mlp_width * options.mlp_width + options.mlp_width) : 0;
  return std::max(4 * parameters,
                  kDdpBytesPerParameter * parameters / world_size + kFsdpUnitsBeyondState * unit_bytes);
}

void run_memory_driver(MemoryDriverOptions options) {
  const MemoryBenchOptions& bench = options.bench;
  const int64_t parameters = model_parameters(bench);
  const int64_t available = available_memory_bytes();
  for (int n : options.world_sizes) {
    const int64_t need = n * estimated_bytes_per_rank(bench, parameters, n);
    if (need > available) {
      throw InvalidArgument(fmt::format(
          "--strategy {} at {} rank{} needs at least {} for {} parameters ({}), more than the {} this host has "
          "available; {}",
          bench.strategy, n, n > 1 ? "s" : "", gigabytes(need), parameters,
          bench.strategy == "ddp" ? "16 bytes each per rank" : "the whole model while each rank builds it",
          gigabytes(available),
          bench.strategy == "ddp" ? "use --strategy fsdp, fewer ranks or a smaller model"
                                  : "use fewer ranks or a smaller model"));
    }
  }
  if (!options.json_path.empty()) require_writable_file("--json", options.json_path);
  const ResultFolder dir;
  const std::string self = shell_quoted(options.program);
  const std::string model =
      bench.model == "mlp" ? fmt::format("MLP of {} parameters ({} x {} layers)", parameters, bench.mlp_width,
                                         mlp_shape(bench.mlp_parameters, bench.mlp_width).layers)
                           : fmt::format("{} ({} parameters) at {}x{}", bench.model, parameters, bench.image_size,
                                         bench.image_size);
  fmt::print(stderr,
             "# tandem bench memory: {} with {}{}, AdamW, batch {} per rank, {} step(s), {} thread(s) per rank; "
             "{} available of {}\n",
             bench.strategy, model,
             bench.strategy == "fsdp" ? fmt::format(" (reshard_after_forward {})", bench.reshard_after_forward) : "",
             bench.batch_size, bench.steps, options.threads, gigabytes(available), gigabytes(host_memory_bytes()));

  nlohmann::json out = nlohmann::json::array();
  // Bytes per rank (MB), the largest rank's: parameters, gradients and AdamW's state counted as tensors;
  // gathered: FSDP's most gathered parameter bytes at once; build and train: VmHWM after building the model and
  // over the steps alone; DDP needs: 16 bytes per parameter per rank.
  fmt::print("{:>8} {:>3} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10}\n", "strategy", "N",
             "params MB", "grads MB", "AdamW MB", "total MB", "gathered MB", "RSS build MB", "RSS train MB",
             "DDP needs MB", "ms/step");
  for (int n : options.world_sizes) {
    const std::string prefix = (dir / fmt::format("memory_{}", n)).string();
    const MemoryWorkerOptions worker{bench, prefix, options.threads};
    run_or_throw(fmt::format("OMP_NUM_THREADS={} {} run --nproc-per-node {} -- {}", options.threads, self, n,
                             worker_command(options.program, "memory", worker, prefix + ".options.json")),
                 fmt::format("the {}-rank {} job", n, bench.strategy));
    std::vector<nlohmann::json> ranks;
    for (int rank = 0; rank < n; ++rank) {
      ranks.push_back(read_result(fmt::format("{}_{}.json", prefix, rank), fmt::format("rank {} of {}", rank, n)));
    }
    const int64_t params = largest(ranks, "parameter_bytes"), grads = largest(ranks, "gradient_bytes");
    const int64_t state = largest(ranks, "optimizer_state_bytes");
    std::vector<double> times;
    for (const auto& rank : ranks) times.push_back(rank["ms_per_step"].get<double>());
    const double ms = *std::max_element(times.begin(), times.end());
    fmt::print("{:>8} {:>3} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10.0f}\n", bench.strategy, n,
               megabytes(params), megabytes(grads), megabytes(state), megabytes(params + grads + state),
               bench.strategy == "fsdp" ? megabytes(largest(ranks, "peak_gathered_bytes")) : "-",
               megabytes(largest(ranks, "peak_resident_build")), megabytes(largest(ranks, "peak_resident_train")),
               megabytes(kDdpBytesPerParameter * parameters), ms);
    out.push_back({{"world_size", n}, {"ranks", ranks}});
  }
  fmt::print("DDP would hold at least {} per rank ({} parameters x 16 bytes); at {} rank(s): {}\n",
             gigabytes(kDdpBytesPerParameter * parameters), parameters, options.world_sizes.back(),
             gigabytes(options.world_sizes.back() * kDdpBytesPerParameter * parameters));
  if (!options.json_path.empty()) {
    nlohmann::json json{{"benchmark", "memory"},
                        {"strategy", bench.strategy},
                        {"model", bench.model},
                        {"parameters", parameters},
                        {"batch_size", bench.batch_size},
                        {"steps", bench.steps},
                        {"threads", options.threads},
                        {"available_bytes", available},
                        {"jobs", out}};
    if (bench.model == "mlp") json["mlp_width"] = bench.mlp_width;
    write_file_atomically(options.json_path, json.dump(2) + "\n");
  }
}

}  // namespace tandem::bench
