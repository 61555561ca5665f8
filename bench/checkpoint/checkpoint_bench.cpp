// `tandem bench checkpoint` (bench/checkpoint/checkpoint_bench.h).
#include "bench/checkpoint/checkpoint_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "bench/harness/child_processes.h"
#include "bench/harness/host.h"
#include "bench/harness/rounds.h"
#include "bench/memory/memory_bench.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace checkpoint_bench {
namespace {

namespace fs = std::filesystem;

struct Timing {
  double write_seconds = 0;
  double read_seconds = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The MLP's state dict: layers.i.weight and .bias, then output.weight and .bias, random.
std::vector<checkpoint::TensorBoxData> mlp_state(const MlpShape& shape) {
  std::vector<checkpoint::TensorBoxData> state;
  const auto add = [&](const std::string& name, std::vector<int64_t> sizes) {
    state.push_back({name, sizes, std::vector<int64_t>(sizes.size(), 0), torch::randn(sizes)});
  };
  for (int64_t layer = 0; layer < shape.layers; ++layer) {
    add(fmt::format("layers.{}.weight", layer), {shape.width, shape.width});
    add(fmt::format("layers.{}.bias", layer), {shape.width});
  }
  add("output.weight", {10, shape.width});
  add("output.bias", {10});
  return state;
}

Timing time_tandem(const std::vector<checkpoint::TensorBoxData>& state, const std::string& dir) {
  Timing timing;
  auto start = std::chrono::steady_clock::now();
  checkpoint::DistributedCheckpointWriter writer(dir);
  writer.write_file(0, state);
  writer.finish();
  timing.write_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  const checkpoint::TensorFile read = checkpoint::read_distributed_checkpoint(dir);
  timing.read_seconds = seconds_since(start);
  // A read that returned other values would have been fast for nothing.
  TANDEM_CHECK(read.tensors.size() == state.size() && torch::equal(read.find(state.front().name), state.front().data),
               "the checkpoint read back differs from the one written");
  fs::remove_all(dir);
  return timing;
}

Timing time_pytorch(const std::string& python, const CheckpointBenchOptions& options, const MlpShape& shape,
                    const std::string& dir, const std::string& result) {
  run_or_throw(fmt::format("{} {} --layers {} --width {} --dir {} --out {}", python,
                           shell_quoted(options.pytorch_script), shape.layers, shape.width, shell_quoted(dir),
                           shell_quoted(result)),
               "the PyTorch side (dcp.save, dcp.load)");
  const nlohmann::json json = read_result(result, "the PyTorch side");
  return {json.at("write_seconds").get<double>(), json.at("read_seconds").get<double>()};
}

}  // namespace
}  // namespace checkpoint_bench

void run_checkpoint_bench(const CheckpointBenchOptions& options) {
  using namespace checkpoint_bench;
  const MlpShape shape = mlp_shape(options.mlp_parameters, options.mlp_width);
  const double bytes = 4.0 * static_cast<double>(shape.parameters());
  // The state, its archives while written, and the copy read back.
  if (3 * bytes > host_memory_bytes() / 4.0) {
    throw InvalidArgument(fmt::format("--mlp-params {} makes a checkpoint of {:.1f} GB, which written and read back "
                                      "takes more than a quarter of this host's memory; lower --mlp-params",
                                      options.mlp_parameters, bytes / 1e9));
  }
  const std::string base = options.dir.empty() ? fs::temp_directory_path().string() : options.dir;
  if (!fs::is_directory(base)) throw InvalidArgument("--dir " + base + " is not a folder");
  if (options.compare_pytorch && !fs::is_regular_file(options.pytorch_script)) {
    throw InvalidArgument(fmt::format("PyTorch side script {} not found; run from the source tree or give "
                                      "--pytorch-script", options.pytorch_script));
  }
  const std::string python = options.compare_pytorch ? find_python_with_fully_shard("--compare pytorch") : "";
  const std::vector<checkpoint::TensorBoxData> state = mlp_state(shape);
  const ResultFolder results;
  fmt::print("tandem bench checkpoint: DCP of an MLP of {} parameters ({:.2f} GB float32, {} layers of {}), one "
             "process, {} rounds\nhost {}, {}\n",
             shape.parameters(), bytes / 1e9, shape.layers, shape.width, options.rounds, host_name(), cpu_model());
  fmt::print("{:>6} {:>14} {:>15} {:>13} {:>14} {:>12} {:>11}\n", "round", "tandem write", "pytorch write",
             "tandem read", "pytorch read", "write ratio", "read ratio");
  std::fflush(stdout);
  std::vector<double> tandem_write, tandem_read, pytorch_write, pytorch_read;
  const auto rate = [&](double seconds) { return bytes / 1e9 / seconds; };
  for (int round = 0; round < options.rounds; ++round) {
    const std::string dir = fmt::format("{}/tandem_bench_checkpoint_{}_{}", base, ::getpid(), round);
    const Timing tandem = time_tandem(state, dir + "_tandem");
    tandem_write.push_back(rate(tandem.write_seconds));
    tandem_read.push_back(rate(tandem.read_seconds));
    if (!options.compare_pytorch) {
      fmt::print("{:>6} {:>9.2f} GB/s {:>15} {:>8.2f} GB/s\n", round + 1, tandem_write.back(), "", tandem_read.back());
      std::fflush(stdout);
      continue;
    }
    const Timing pytorch =
        time_pytorch(python, options, shape, dir + "_pytorch", (results / fmt::format("pytorch_{}.json", round)).string());
    pytorch_write.push_back(rate(pytorch.write_seconds));
    pytorch_read.push_back(rate(pytorch.read_seconds));
    fmt::print("{:>6} {:>9.2f} GB/s {:>10.2f} GB/s {:>8.2f} GB/s {:>9.2f} GB/s {:>12.2f} {:>11.2f}\n", round + 1,
               tandem_write.back(), pytorch_write.back(), tandem_read.back(), pytorch_read.back(),
               tandem_write.back() / pytorch_write.back(), tandem_read.back() / pytorch_read.back());
    std::fflush(stdout);
  }
  if (options.compare_pytorch) {
    fmt::print("{:>6} {:>9.2f} GB/s {:>10.2f} GB/s {:>8.2f} GB/s {:>9.2f} GB/s {:>12.2f} {:>11.2f}   (ratios: "
               "medians of the rounds' ratios)\n",
               "median", median_of(tandem_write), median_of(pytorch_write), median_of(tandem_read),
               median_of(pytorch_read), paired_ratio(tandem_write, pytorch_write),
               paired_ratio(tandem_read, pytorch_read));
  } else {
    fmt::print("{:>6} {:>9.2f} GB/s {:>15} {:>8.2f} GB/s\n", "median", median_of(tandem_write), "",
               median_of(tandem_read));
  }
  std::fflush(stdout);
}

}  // namespace tandem::bench
