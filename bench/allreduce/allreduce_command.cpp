#include "bench/allreduce/allreduce_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/allreduce/allreduce_bench.h"
#include "bench/harness/host.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {

namespace {

// What a table and its JSON say about the run beside the rows.
struct AllreduceSetting {
  std::string backend;
  int world_size = 1;
  torch::Device device = torch::kCPU;
  MemcpyResult copy;  // rank 0's ceiling
  // An all-reduce over one rank moves no data, so bytes per second of it would measure nothing: the table keeps
  // the time of a call and leaves the bandwidth columns out.
  bool one_rank() const { return world_size == 1; }
};

void print_allreduce_header(const AllreduceCommandOptions& flags, const AllreduceSetting& run) {
  const bool one_rank = run.one_rank();
  fmt::print("# tandem bench allreduce: backend {}, {} rank{}, float32 sum in place on {}, host {} ({} cores, {})\n",
             run.backend, run.world_size, one_rank ? "" : "s", run.device.str(), host_name(),
             std::thread::hardware_concurrency(), cpu_model());
  fmt::print("# sizes {}, iters {}, warmup {}{}\n", flags.sizes,
             flags.iters > 0 ? std::to_string(flags.iters) : "auto", flags.warmup,
             one_rank ? "" : "; busbw = algbw * 2(n-1)/n (nccl-tests)");
  fmt::print("# {} bandwidth ({}{}): {:.2f} GB/s\n", run.device.is_cuda() ? "device-to-device copy" : "memcpy",
             run.device.is_cuda() ? "" : "1 thread, ", format_size(run.copy.bytes), run.copy.gbps);
  if (one_rank) {
    fmt::print("# world size 1: an all-reduce over one rank moves no data, so there is no bandwidth to report, "
               "only the time of a call; start 2 or more ranks (tandem run --nproc-per-node 2 -- tandem bench "
               "allreduce)\n");
    fmt::print("{:>8} {:>6} {:>13} {:>6}\n", "size", "iters", "time/op(us)", "check");
  } else {
    fmt::print("{:>8} {:>6} {:>13} {:>12} {:>12} {:>14} {:>6}\n", "size", "iters", "time/op(us)", "algbw(GB/s)",
               "busbw(GB/s)", "busbw/memcpy", "check");
  }
  std::fflush(stdout);
}

void print_allreduce_row(const AllreduceRow& row, const AllreduceSetting& run) {
  if (run.one_rank()) {
    fmt::print("{:>8} {:>6} {:>13.1f} {:>6}\n", format_size(row.bytes), row.iters, row.seconds_per_op * 1e6,
               row.correct ? "ok" : "WRONG");
  } else {
    fmt::print("{:>8} {:>6} {:>13.1f} {:>12.3f} {:>12.3f} {:>13.1f}% {:>6}\n", format_size(row.bytes), row.iters,
               row.seconds_per_op * 1e6, row.algbw_gbps, row.busbw_gbps, 100.0 * row.busbw_gbps / run.copy.gbps,
               row.correct ? "ok" : "WRONG");
  }
}

void write_allreduce_json(const std::string& path, const AllreduceSetting& run, const std::vector<AllreduceRow>& rows) {
  nlohmann::json out;
  out["benchmark"] = "allreduce";
  out["backend"] = run.backend;
  out["world_size"] = run.world_size;
  out["dtype"] = "float32";
  out["op"] = "sum";
  out["host"] = {{"name", host_name()}, {"cores", std::thread::hardware_concurrency()}, {"cpu_model", cpu_model()}};
  out["memcpy"] = {{"bytes", run.copy.bytes}, {"iters", run.copy.iters}, {"gbps", run.copy.gbps}};
  if (run.one_rank()) out["note"] = "world size 1: an all-reduce moves no data, so the results hold no bandwidth";
  out["results"] = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json result{{"bytes", row.bytes},
                          {"iters", row.iters},
                          {"time_us", row.seconds_per_op * 1e6},
                          {"correct", row.correct}};
    if (!run.one_rank()) {
      result["algbw_gbps"] = row.algbw_gbps;
      result["busbw_gbps"] = row.busbw_gbps;
      result["busbw_over_memcpy"] = row.busbw_gbps / run.copy.gbps;
    }
    out["results"].push_back(result);
  }
  write_file_atomically(path, out.dump(2) + "\n");
}

}  // namespace

void run_allreduce_command(const AllreduceCommandOptions& flags) {
  AllreduceBenchOptions options;
  options.sizes = parse_sizes(flags.sizes);
  options.iters = flags.iters;
  options.warmup = flags.warmup;
  const int64_t memcpy_bytes = parse_size(flags.memcpy_size);
  // Rank 0 writes the file; it checks the path before joining, so that a wrong one costs no measurement.
  if (!flags.json_path.empty() && comm::detect_rank_layout().rank == 0) require_writable_file("--json", flags.json_path);

  InitOptions init;
  init.device = flags.device;
  init.backend = flags.backend;
  init.timeout = std::chrono::seconds(flags.timeout_s);
  ProcessGroup& group = init_process_group(init);
  options.device = group.device();
  comm::Communicator& comm = group.communicator();
  const bool main = is_main_process();
  AllreduceSetting run{comm.backend_name(), comm.world_size(), options.device, {}};
  // The ceiling on one host: one thread copying memory, measured by rank 0 while the others wait, so the
  // figure is the same whatever the world size.
  if (main) run.copy = measure_memcpy(memcpy_bytes, 10, options.device);
  barrier();
  if (main) print_allreduce_header(flags, run);
  std::vector<AllreduceRow> rows;
  // One size at a time, so the table grows as the run goes.
  for (int64_t size : options.sizes) {
    AllreduceBenchOptions one = options;
    one.sizes = {size};
    rows.push_back(run_allreduce_bench(comm, one).front());
    if (main) print_allreduce_row(rows.back(), run);
    std::fflush(stdout);
  }
  if (main && !flags.json_path.empty()) write_allreduce_json(flags.json_path, run, rows);
  destroy_process_group();
  if (!std::all_of(rows.begin(), rows.end(), [](const auto& row) { return row.correct; })) {
    throw CommError("an all-reduce gave a wrong result (see the check column)");
  }
}

}  // namespace tandem::bench
