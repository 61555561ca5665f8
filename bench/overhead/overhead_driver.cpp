#include "bench/overhead/overhead_driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "bench/harness/child_processes.h"
#include "bench/harness/rounds.h"
#include "bench/harness/worker_options.h"
#include "bench/overhead/overhead_worker.h"
#include "tandem/comm/backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {
namespace {

bool mpirun_on_path() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

std::vector<std::string> default_overhead_backends() {
  std::vector<std::string> backends{"gloo"};
  const auto built = comm::available_backends();
  if (std::find(built.begin(), built.end(), "mpi") != built.end() && mpirun_on_path()) backends.push_back("mpi");
  return backends;
}

void check_overhead_settings(const OverheadDriverOptions& options) {
  if (!options.json_path.empty()) require_writable_file("--json", options.json_path);
  const auto& backends = options.backends;
  if (std::find(backends.begin(), backends.end(), "mpi") != backends.end() && !mpirun_on_path()) {
    throw UnsupportedError(
        "--backends mpi starts its DDP jobs with mpirun, which is not on PATH; install Open MPI (on Debian: apt-get "
        "install -y openmpi-bin) or drop mpi from --backends");
  }
  if (options.compare_pytorch && !std::filesystem::is_regular_file(options.pytorch_script)) {
    throw InvalidArgument(fmt::format("PyTorch side script {} not found; run from the repository root, pass "
                                      "--pytorch-script or use --compare none",
                                      options.pytorch_script));
  }
}

// Starts the workers of one measurement and reads back what they wrote.
class OverheadRunner {
 public:
  explicit OverheadRunner(const OverheadDriverOptions& options)
      : options_(options),
        self_(shell_quoted(options.program)),
        python_(options.compare_pytorch ? find_python("--compare pytorch") : "") {}

  nlohmann::json tandem_plain() {
    const std::string result = path("plain.json");
    run_or_throw(kOneThread + worker("plain", "gloo", result), "the plain LibTorch process");
    return read_result(result, "the plain LibTorch process");
  }

  nlohmann::json tandem_ddp(int world_size, const std::string& backend) {
    const std::string result = path(fmt::format("ddp_{}_{}.json", backend, world_size));
    const std::string what = fmt::format("the {}-rank DDP job over {}", world_size, backend);
    const std::string ranks =
        backend == "mpi" ? fmt::format("mpirun {}-np {} ", ::geteuid() == 0 ? "--allow-run-as-root " : "", world_size)
                         : fmt::format("{} run --nproc-per-node {} -- ", self_, world_size);
    run_or_throw(kOneThread + ranks + worker("ddp", backend, result), what);
    return read_result(result, what);
  }

  nlohmann::json pytorch(const std::string& mode, int world_size) {
    const OverheadBenchOptions& b = options_.bench;
    const std::string result = path(fmt::format("py_{}_{}.json", mode, world_size));
    run_or_throw(fmt::format("{}{} {} --mode {} --nproc {} --batch-size {} --steps {} --repeats {} --warmup {} > {}",
                             kOneThread, python_, shell_quoted(options_.pytorch_script), mode, world_size,
                             b.batch_size, b.steps, b.repeats, b.warmup, shell_quoted(result)),
                 "the PyTorch overhead script");
    return read_result(result, "the PyTorch overhead script");
  }

 private:
  // Every process of every measurement gets one intra-op thread, as the probe that the issue published.
  static constexpr const char* kOneThread = "OMP_NUM_THREADS=1 ";

  std::string path(const std::string& file) const { return (folder_ / file).string(); }
  // The shell words of one worker, which writes its result to `result`; its options beside it.
  std::string worker(const std::string& mode, const std::string& backend, const std::string& result) const {
    return worker_command(options_.program, "overhead", OverheadWorkerOptions{mode, backend, result, options_.bench},
                          result + ".options.json");
  }

  const OverheadDriverOptions& options_;
  const ResultFolder folder_;
  std::string self_;
  std::string python_;
};

// PyTorch's row that `row` is compared with: the same wrapper and world size (PyTorch's DDP runs over gloo).
const OverheadRow* pytorch_counterpart(const std::vector<OverheadRow>& rows, const OverheadRow& row) {
  for (const auto& other : rows) {
    if (other.framework == "pytorch" && other.wrapper == row.wrapper && other.world_size == row.world_size) {
      return &other;
    }
  }
  return nullptr;
}

nlohmann::json print_overhead_table(const std::vector<OverheadRow>& rows) {
  fmt::print("{:>9} {:>7} {:>7} {:>3} {:>9} {:>21} {:>14} {:>13}\n", "framework", "wrapper", "backend", "N",
             "us/step", "rounds", "allreduce(us)", "vs pytorch");
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : rows) {
    const double us = median_over_rounds(row.rounds, "us_per_step_median");
    const double allreduce_us = median_over_rounds(row.rounds, "allreduce_us");
    const std::vector<double> per_round = values_of(row.rounds, "us_per_step_median");
    const OverheadRow* pytorch = row.framework == "tandem" ? pytorch_counterpart(rows, row) : nullptr;
    const double ratio = pytorch ? paired_overhead_ratio(row, *pytorch) : 0;
    fmt::print("{:>9} {:>7} {:>7} {:>3} {:>9.1f} {:>21} {:>14} {:>13}\n", row.framework, row.wrapper, row.backend,
               row.world_size, us, fmt::format("{:.0f}", fmt::join(per_round, ",")),
               allreduce_us > 0 ? fmt::format("{:.1f}", allreduce_us) : "-",
               pytorch ? fmt::format("{:.3f}", ratio) : "-");
    nlohmann::json entry = {{"framework", row.framework}, {"wrapper", row.wrapper},
                            {"backend", row.backend},     {"world_size", row.world_size},
                            {"us_per_step_median", us},   {"us_per_step_per_round", per_round},
                            {"allreduce_us", allreduce_us}};
    if (pytorch) entry["ratio_to_pytorch"] = ratio;
    out.push_back(entry);
  }
  return out;
}

}  // namespace

double paired_overhead_ratio(const OverheadRow& tandem, const OverheadRow& pytorch) {
  return paired_ratio(tandem.rounds, pytorch.rounds, "us_per_step_median");
}

std::vector<std::string> parse_overhead_backends(const std::string& text) {
  const auto built = comm::available_backends();
  std::vector<std::string> backends;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, comma - start);
    if (name != "gloo" && name != "mpi") {
      throw InvalidArgument(fmt::format("'{}' is not a CPU backend; give gloo, mpi or both: gloo,mpi", name));
    }
    if (std::find(built.begin(), built.end(), name) == built.end()) {
      throw UnsupportedError(fmt::format("this build has no {} backend; drop it from the list", name));
    }
    if (std::find(backends.begin(), backends.end(), name) != backends.end()) {
      throw InvalidArgument(fmt::format("backend {} is given twice; give each once", name));
    }
    backends.push_back(name);
    start = comma + 1;
  }
  return backends;
}

void run_overhead_driver(OverheadDriverOptions options) {
  if (options.backends.empty()) options.backends = default_overhead_backends();
  check_overhead_settings(options);
  const OverheadBenchOptions& b = options.bench;
  fmt::print(stderr,
             "# tandem bench overhead: MLP {}-{}-{}, batch {} per process, SGD with momentum, 1 thread per process, "
             "{} round(s) of {} x {} steps after {} warm-up; tandem's DDP over {}{}\n",
             kOverheadInputs, kOverheadHidden, kOverheadClasses, b.batch_size, options.rounds, b.repeats, b.steps,
             b.warmup, fmt::join(options.backends, " and "),
             options.compare_pytorch ? "; PyTorch's DDP over gloo" : "");
  OverheadRunner runner(options);
  std::vector<OverheadRow> rows{{"tandem", "plain", "-", 1, {}}};
  if (options.compare_pytorch) rows.push_back({"pytorch", "plain", "-", 1, {}});
  for (int n : options.world_sizes) {
    for (const auto& backend : options.backends) rows.push_back({"tandem", "DDP", backend, n, {}});
    if (options.compare_pytorch) rows.push_back({"pytorch", "DDP", "gloo", n, {}});
  }
  for (int round = 0; round < options.rounds; ++round) {
    for (auto& row : rows) {
      const bool plain = row.wrapper == "plain";
      if (row.framework == "tandem") {
        row.rounds.push_back(plain ? runner.tandem_plain() : runner.tandem_ddp(row.world_size, row.backend));
      } else {
        row.rounds.push_back(runner.pytorch(plain ? "plain" : "ddp", row.world_size));
      }
    }
  }
  nlohmann::json table = print_overhead_table(rows);
  if (options.json_path.empty()) return;
  nlohmann::json out = {{"benchmark", "overhead"},
                        {"model", fmt::format("mlp {}-{}-{}", kOverheadInputs, kOverheadHidden, kOverheadClasses)},
                        {"batch_size", b.batch_size},
                        {"steps", b.steps},
                        {"repeats", b.repeats},
                        {"warmup", b.warmup},
                        {"rounds", options.rounds},
                        {"rows", table}};
  write_file_atomically(options.json_path, out.dump(2) + "\n");
}

}  // namespace tandem::bench
