#pragma once
// The all-reduce bandwidth benchmark behind `tandem bench allreduce`, measured the way nccl-tests does:
// algorithm bandwidth = bytes / time per op, bus bandwidth = algbw * 2(n-1)/n (the traffic each rank's link
// carries in a ring all-reduce, so figures compare across world sizes), beside the host's memory-copy
// bandwidth, the ceiling for any transfer between processes on one host.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/comm/communicator.h"

namespace tandem::bench {

// Beyond any machine's memory, and small enough that doubling it cannot overflow.
inline constexpr int64_t kLargestSize = int64_t{1} << 50;

// "4096", "4K", "64M", "1G" (binary units) -> bytes, from 1 to kLargestSize. Throws InvalidArgument on anything
// else.
int64_t parse_size(const std::string& text);
// "4K..64M" -> 4K, 8K, ..., 64M (doubling); "4K,1M" -> a list; a single size -> itself.
std::vector<int64_t> parse_sizes(const std::string& text);
// 4096 -> "4K", 67108864 -> "64M"; sizes that are no whole unit print in bytes.
std::string format_size(int64_t bytes);

// nccl-tests' definition for all-reduce.
double allreduce_bus_bandwidth(double algbw, int world_size);

struct MemcpyResult {
  int64_t bytes = 0;
  int iters = 0;
  double seconds_per_copy = 0;
  double gbps = 0;  // bytes copied per second / 1e9 (each byte counted once, as busbw counts it)
};
// One thread memcpy of `bytes` between two buffers larger than the caches, averaged over `iters` copies after
// one untimed copy that faults the pages in. On a GPU: a device-to-device copy, the ceiling for a collective
// whose ranks share that GPU's memory.
MemcpyResult measure_memcpy(int64_t bytes, int iters, const torch::Device& device = torch::kCPU);

struct AllreduceBenchOptions {
  std::vector<int64_t> sizes = parse_sizes("4K..64M");
  int iters = 0;  // timed ops per size; 0 picks iterations_for(size)
  int warmup = 2;
  torch::Device device = torch::kCPU;  // where the buffer lives; a GPU is synchronised before each clock reading
};

struct AllreduceRow {
  int64_t bytes = 0;
  int iters = 0;
  double seconds_per_op = 0;  // slowest rank's mean
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  bool correct = false;  // one all-reduce of ones gave world_size everywhere, on every rank
};

// Enough iterations for a stable mean without spending minutes on the large sizes: about 2 GB of payload
// per size, between 5 and 200 ops (or `requested` when positive).
int iterations_for(int64_t bytes, int requested);

// Collective over every rank of `comm`: all ranks call it with the same options and get the same rows.
// float32 sum, in place, one op in flight at a time (wait() before the next), like nccl-tests' -w/-n loops.
std::vector<AllreduceRow> run_allreduce_bench(comm::Communicator& comm, const AllreduceBenchOptions& options);

}  // namespace tandem::bench
