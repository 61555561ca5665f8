#include "bench/allreduce_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/allreduce_bench.h"
#include "bench/host.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {

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
  const unsigned cores = std::thread::hardware_concurrency();
  // An all-reduce over one rank moves no data, so bytes per second of it would measure nothing: the table keeps
  // the time of a call and leaves the bandwidth columns out.
  const bool one_rank = comm.world_size() == 1;

  // The ceiling on one host: one thread copying memory, measured by rank 0 while the others wait, so the
  // figure is the same whatever the world size.
  MemcpyResult copy;
  if (main) copy = measure_memcpy(memcpy_bytes, 10, options.device);
  barrier();

  if (main) {
    fmt::print("# tandem bench allreduce: backend {}, {} rank{}, float32 sum in place on {}, host {} ({} cores, {})\n",
               comm.backend_name(), comm.world_size(), one_rank ? "" : "s", options.device.str(), host_name(), cores,
               cpu_model());
    fmt::print("# sizes {}, iters {}, warmup {}{}\n", flags.sizes,
               flags.iters > 0 ? std::to_string(flags.iters) : "auto", flags.warmup,
               one_rank ? "" : "; busbw = algbw * 2(n-1)/n (nccl-tests)");
    fmt::print("# {} bandwidth ({}{}): {:.2f} GB/s\n", options.device.is_cuda() ? "device-to-device copy" : "memcpy",
               options.device.is_cuda() ? "" : "1 thread, ", format_size(copy.bytes), copy.gbps);
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
  std::vector<AllreduceRow> rows;
  // One size at a time, so the table grows as the run goes.
  for (int64_t size : options.sizes) {
    AllreduceBenchOptions one = options;
    one.sizes = {size};
    AllreduceRow row = run_allreduce_bench(comm, one).front();
    rows.push_back(row);
    if (main && one_rank) {
      fmt::print("{:>8} {:>6} {:>13.1f} {:>6}\n", format_size(row.bytes), row.iters, row.seconds_per_op * 1e6,
                 row.correct ? "ok" : "WRONG");
    } else if (main) {
      fmt::print("{:>8} {:>6} {:>13.1f} {:>12.3f} {:>12.3f} {:>13.1f}% {:>6}\n", format_size(row.bytes), row.iters,
                 row.seconds_per_op * 1e6, row.algbw_gbps, row.busbw_gbps, 100.0 * row.busbw_gbps / copy.gbps,
                 row.correct ? "ok" : "WRONG");
    }
    std::fflush(stdout);
  }

  if (main && !flags.json_path.empty()) {
    nlohmann::json out;
    out["benchmark"] = "allreduce";
    out["backend"] = comm.backend_name();
    out["world_size"] = comm.world_size();
    out["dtype"] = "float32";
    out["op"] = "sum";
    out["host"] = {{"name", host_name()}, {"cores", cores}, {"cpu_model", cpu_model()}};
    out["memcpy"] = {{"bytes", copy.bytes}, {"iters", copy.iters}, {"gbps", copy.gbps}};
    if (one_rank) out["note"] = "world size 1: an all-reduce moves no data, so the results hold no bandwidth";
    out["results"] = nlohmann::json::array();
    for (const auto& row : rows) {
      nlohmann::json result{{"bytes", row.bytes},
                            {"iters", row.iters},
                            {"time_us", row.seconds_per_op * 1e6},
                            {"correct", row.correct}};
      if (!one_rank) {
        result["algbw_gbps"] = row.algbw_gbps;
        result["busbw_gbps"] = row.busbw_gbps;
        result["busbw_over_memcpy"] = row.busbw_gbps / copy.gbps;
      }
      out["results"].push_back(result);
    }
    write_file_atomically(flags.json_path, out.dump(2) + "\n");
  }
  destroy_process_group();
  if (!std::all_of(rows.begin(), rows.end(), [](const auto& row) { return row.correct; })) {
    throw CommError("an all-reduce gave a wrong result (see the check column)");
  }
}

}  // namespace tandem::bench
