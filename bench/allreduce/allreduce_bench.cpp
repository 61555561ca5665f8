#include "bench/allreduce/allreduce_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <memory>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

MemcpyResult measure_device_copy(int64_t bytes, int iters, const torch::Device& device) {
  torch::Tensor source = torch::ones({bytes}, torch::TensorOptions(torch::kUInt8).device(device));
  torch::Tensor target = torch::empty_like(source);
  target.copy_(source);
  synchronize(device);
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) (i % 2 == 0 ? target : source).copy_(i % 2 == 0 ? source : target);
  synchronize(device);
  MemcpyResult result;
  result.bytes = bytes;
  result.iters = iters;
  result.seconds_per_copy = seconds_since(start) / iters;
  result.gbps = static_cast<double>(bytes) / result.seconds_per_copy / 1e9;
  return result;
}

}  // namespace

int64_t parse_size(const std::string& text) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  int64_t unit = 1;
  if (value >= 0 && used + 1 == text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text.back()))) {
      case 'K':
        unit = int64_t{1} << 10;
        break;
      case 'M':
        unit = int64_t{1} << 20;
        break;
      case 'G':
        unit = int64_t{1} << 30;
        break;
      default:
        value = -1;
    }
  } else if (used != text.size()) {
    value = -1;
  }
  if (value <= 0) {
    throw InvalidArgument(fmt::format("size '{}' is not a positive number of bytes (e.g. 4096, 4K, 64M, 1G)", text));
  }
  if (value > kLargestSize / unit) {
    throw InvalidArgument(fmt::format("size '{}' is more than the largest, {}", text, format_size(kLargestSize)));
  }
  return value * unit;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  if (size_t dots = text.find(".."); dots != std::string::npos) {
    int64_t first = parse_size(text.substr(0, dots));
    int64_t last = parse_size(text.substr(dots + 2));
    if (last < first) throw InvalidArgument(fmt::format("size range '{}' runs backwards; put the smaller size first", text));
    // Both ends are at most kLargestSize, so doubling never overflows.
    for (int64_t size = first; size <= last; size *= 2) sizes.push_back(size);
    return sizes;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    sizes.push_back(parse_size(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return sizes;
}

std::string format_size(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) return fmt::format("{}G", bytes >> 30);
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (int64_t{1} << 10) && bytes % (int64_t{1} << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

double allreduce_bus_bandwidth(double algbw, int world_size) {
  return world_size > 1 ? algbw * 2.0 * (world_size - 1) / world_size : algbw;
}

MemcpyResult measure_memcpy(int64_t bytes, int iters, const torch::Device& device) {
  TANDEM_CHECK(bytes > 0 && iters > 0, "bytes ", bytes, " iters ", iters);
  if (device.is_cuda()) return measure_device_copy(bytes, iters, device);
  auto source = std::make_unique<char[]>(static_cast<size_t>(bytes));
  auto target = std::make_unique<char[]>(static_cast<size_t>(bytes));
  std::memset(source.get(), 1, static_cast<size_t>(bytes));
  std::memcpy(target.get(), source.get(), static_cast<size_t>(bytes));
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    // Alternate direction so no copy can be skipped as a repeat of the last one.
    if (i % 2 == 0) {
      std::memcpy(target.get(), source.get(), static_cast<size_t>(bytes));
    } else {
      std::memcpy(source.get(), target.get(), static_cast<size_t>(bytes));
    }
  }
  MemcpyResult result;
  result.bytes = bytes;
  result.iters = iters;
  result.seconds_per_copy = seconds_since(start) / iters;
  result.gbps = static_cast<double>(bytes) / result.seconds_per_copy / 1e9;
  // Keep the copies observable.
  TANDEM_CHECK(target[bytes - 1] == 1, "memcpy produced a wrong byte");
  return result;
}

int iterations_for(int64_t bytes, int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::clamp<int64_t>((int64_t{2} << 30) / bytes, 5, 200));
}

std::vector<AllreduceRow> run_allreduce_bench(comm::Communicator& comm, const AllreduceBenchOptions& options) {
  const int world = comm.world_size();
  std::vector<AllreduceRow> rows;
  for (int64_t bytes : options.sizes) {
    AllreduceRow row;
    const int64_t numel = std::max<int64_t>(1, bytes / static_cast<int64_t>(sizeof(float)));
    row.bytes = numel * static_cast<int64_t>(sizeof(float));
    row.iters = iterations_for(row.bytes, options.iters);

    torch::Tensor buffer = torch::ones({numel}, torch::TensorOptions(torch::kFloat32).device(options.device));
    comm.all_reduce(buffer, comm::ReduceOp::Sum)->wait();
    torch::Tensor correct = torch::tensor({torch::all(buffer == static_cast<float>(world)).item<bool>() ? 1.0 : 0.0},
                                          torch::kFloat64);
    comm::all_reduce_values(comm, correct, comm::ReduceOp::Min);
    row.correct = correct.item<double>() == 1.0;

    // Zeros stay zeros under repeated sums, so the timed loop never meets overflow or denormals.
    buffer.zero_();
    for (int i = 0; i < options.warmup; ++i) comm.all_reduce(buffer, comm::ReduceOp::Sum)->wait();
    synchronize(options.device);
    comm.barrier()->wait();
    auto start = Clock::now();
    for (int i = 0; i < row.iters; ++i) comm.all_reduce(buffer, comm::ReduceOp::Sum)->wait();
    synchronize(options.device);
    torch::Tensor elapsed = torch::tensor({seconds_since(start)}, torch::kFloat64);
    comm::all_reduce_values(comm, elapsed, comm::ReduceOp::Max);

    row.seconds_per_op = elapsed.item<double>() / row.iters;
    row.algbw_gbps = static_cast<double>(row.bytes) / row.seconds_per_op / 1e9;
    row.busbw_gbps = allreduce_bus_bandwidth(row.algbw_gbps, world);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace tandem::bench
