// `tandem bench`: benchmarks that print tables (and JSON with --json), run as every rank of a job:
//   tandem run --nproc-per-node 2 -- tandem bench allreduce              (gloo)
//   mpirun -np 2 tandem bench allreduce --backend mpi                     (mpi)
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/command.h"
#include "tandem/bench/allreduce_bench.h"
#include "tandem/comm/backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/error.h"

namespace tandem::app {
namespace {

struct AllreduceFlags {
  std::string backend = "gloo";
  std::string sizes = "4K..64M";
  int iters = 0;
  int warmup = 2;
  std::string memcpy_size = "64M";
  std::string json_path;
  int timeout_s = 300;
};

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

int run_allreduce(const AllreduceFlags& flags) {
  bench::AllreduceBenchOptions options;
  options.sizes = bench::parse_sizes(flags.sizes);
  options.iters = flags.iters;
  options.warmup = flags.warmup;
  const int64_t memcpy_bytes = bench::parse_size(flags.memcpy_size);

  InitOptions init;
  init.backend = flags.backend;
  init.timeout = std::chrono::seconds(flags.timeout_s);
  ProcessGroup& group = init_process_group(init);
  comm::Communicator& comm = group.communicator();
  const bool main = is_main_process();
  const unsigned cores = std::thread::hardware_concurrency();

  // The ceiling on one host: one thread copying memory, measured by rank 0 while the others wait, so the
  // figure is the same whatever the world size.
  bench::MemcpyResult copy;
  if (main) copy = bench::measure_memcpy(memcpy_bytes, 10);
  barrier();

  if (main) {
    fmt::print("# tandem bench allreduce: backend {}, {} ranks, float32 sum in place, host {} ({} cores, {})\n",
               comm.backend_name(), comm.world_size(), host_name(), cores, cpu_model());
    fmt::print("# sizes {}, iters {}, warmup {}; busbw = algbw * 2(n-1)/n (nccl-tests)\n", flags.sizes,
               flags.iters > 0 ? std::to_string(flags.iters) : "auto", flags.warmup);
    fmt::print("# memcpy bandwidth (1 thread, {}): {:.2f} GB/s\n", bench::format_size(copy.bytes), copy.gbps);
    fmt::print("{:>8} {:>6} {:>13} {:>12} {:>12} {:>14} {:>6}\n", "size", "iters", "time/op(us)", "algbw(GB/s)",
               "busbw(GB/s)", "busbw/memcpy", "check");
    std::fflush(stdout);
  }
  std::vector<bench::AllreduceRow> rows;
  // One size at a time, so the table grows as the run goes.
  for (int64_t size : options.sizes) {
    bench::AllreduceBenchOptions one = options;
    one.sizes = {size};
    bench::AllreduceRow row = bench::run_allreduce_bench(comm, one).front();
    rows.push_back(row);
    if (main) {
      fmt::print("{:>8} {:>6} {:>13.1f} {:>12.3f} {:>12.3f} {:>13.1f}% {:>6}\n", bench::format_size(row.bytes),
                 row.iters, row.seconds_per_op * 1e6, row.algbw_gbps, row.busbw_gbps,
                 100.0 * row.busbw_gbps / copy.gbps, row.correct ? "ok" : "WRONG");
      std::fflush(stdout);
    }
  }

  bool all_correct = std::all_of(rows.begin(), rows.end(), [](const auto& row) { return row.correct; });
  if (main && !flags.json_path.empty()) {
    nlohmann::json out;
    out["benchmark"] = "allreduce";
    out["backend"] = comm.backend_name();
    out["world_size"] = comm.world_size();
    out["dtype"] = "float32";
    out["op"] = "sum";
    out["host"] = {{"name", host_name()}, {"cores", cores}, {"cpu_model", cpu_model()}};
    out["memcpy"] = {{"bytes", copy.bytes}, {"iters", copy.iters}, {"gbps", copy.gbps}};
    for (const auto& row : rows) {
      out["results"].push_back({{"bytes", row.bytes},
                                {"iters", row.iters},
                                {"time_us", row.seconds_per_op * 1e6},
                                {"algbw_gbps", row.algbw_gbps},
                                {"busbw_gbps", row.busbw_gbps},
                                {"busbw_over_memcpy", row.busbw_gbps / copy.gbps},
                                {"correct", row.correct}});
    }
    std::ofstream file(flags.json_path);
    if (!file) throw InvalidArgument(fmt::format("cannot write --json file '{}'", flags.json_path));
    file << out.dump(2) << "\n";
  }
  destroy_process_group();
  if (!all_correct) {
    if (main) std::fprintf(stderr, "tandem bench: error: an all-reduce gave a wrong result (see the check column)\n");
    return 1;
  }
  return 0;
}

const CommandRegistration kBench{
    "bench", "Benchmarks: all-reduce bandwidth per backend", [](CLI::App& command) {
      command.require_subcommand(1);
      auto flags = std::make_shared<AllreduceFlags>();
      CLI::App* allreduce = command.add_subcommand(
          "allreduce", "All-reduce algorithm and bus bandwidth per size, beside the host's memcpy bandwidth");
      allreduce->add_option("--backend", flags->backend, "Communication backend")
          ->capture_default_str()
          ->check(CLI::IsMember(comm::available_backends()));
      allreduce->add_option("--sizes", flags->sizes, "Sizes in bytes: FIRST..LAST (doubling) or a list A,B,C")
          ->capture_default_str();
      allreduce->add_option("--iters", flags->iters, "Timed all-reduces per size (0: about 2 GB, 5..200)")
          ->capture_default_str();
      allreduce->add_option("--warmup", flags->warmup, "Untimed all-reduces per size")->capture_default_str();
      allreduce->add_option("--memcpy-size", flags->memcpy_size, "Buffer size for the memcpy ceiling")
          ->capture_default_str();
      allreduce->add_option("--json", flags->json_path, "Also write the results as JSON to this file (rank 0)");
      allreduce->add_option("--timeout", flags->timeout_s, "Seconds before a collective counts as hung")
          ->capture_default_str();
      return [flags, allreduce]() -> int {
        if (allreduce->parsed()) return run_allreduce(*flags);
        return 2;
      };
    }};

}  // namespace
}  // namespace tandem::app
