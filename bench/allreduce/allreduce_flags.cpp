// `tandem bench allreduce`: all-reduce bandwidth per size and backend, run as every rank of a job
// (bench/allreduce/allreduce_command.h).
//   tandem run --nproc-per-node 2 -- tandem bench allreduce              (gloo)
//   mpirun -np 2 tandem bench allreduce --backend mpi                     (mpi)
#include <memory>

#include "apps/backend_flag.h"
#include "bench/bench_commands.h"
#include "bench/harness/flag_checks.h"
#include "apps/flag_checks.h"
#include "bench/allreduce/allreduce_command.h"
#include "tandem/comm/backend.h"

namespace tandem::app {
namespace {

const CommandRegistration kBenchAllreduce{
    bench_commands(),
    "allreduce", "All-reduce algorithm and bus bandwidth per size, beside the host's memcpy bandwidth",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<bench::AllreduceCommandOptions>();
      CLI::App* allreduce = &command;
      allreduce->add_option("--device", flags->device, "Where the buffer lives: cpu, cuda (GPU LOCAL_RANK) or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      allreduce->add_option("--backend", flags->backend, backend_flag_help("the buffer lives"))
          ->check(CLI::IsMember(comm::available_backends()));
      allreduce->add_option("--sizes", flags->sizes,
                            "Sizes in bytes (4096, 4K, 64M, 1G): FIRST..LAST (doubling) or a list A,B,C")
          ->capture_default_str()
          ->check(bench_allreduce_sizes());
      allreduce->add_option("--iters", flags->iters, "Timed all-reduces per size (0: about 2 GB, 5..200)")
          ->capture_default_str()
          ->check(at_least<int>(0));
      allreduce->add_option("--warmup", flags->warmup, "Untimed all-reduces per size")
          ->capture_default_str()
          ->check(at_least<int>(0));
      allreduce->add_option("--memcpy-size", flags->memcpy_size, "Buffer size in bytes for the memcpy ceiling")
          ->capture_default_str()
          ->check(bench_memcpy_size());
      allreduce->add_option("--json", flags->json_path, "Also write the results as JSON to this file (rank 0)");
      allreduce->add_option("--timeout", flags->timeout_s,
                            "Seconds before a collective counts as hung (at most a year)")
          ->capture_default_str()
          ->check(between<int>(1, kLongestTimeoutSeconds));
      return [flags]() -> int {
        bench::run_allreduce_command(*flags);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
