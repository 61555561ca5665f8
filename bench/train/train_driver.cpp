#include "bench/train/train_driver.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/harness/child_processes.h"
#include "bench/harness/host.h"
#include "bench/harness/rounds.h"
#include "bench/harness/worker_options.h"
#include "bench/train/train_worker.h"
#include "tandem/comm/backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {
namespace {

// One framework and wrapper at one world size: per round, the measured job and the independent processes that
// it is compared with, run back to back so that both see the machine in the same state.
struct TrainRow {
  std::string framework;
  std::string wrapper;  // DDP: a job of N processes; DP: DataParallel, one process with N replicas
  int world_size = 1;
  std::vector<nlohmann::json> job;          // the measured job, one result per round
  std::vector<nlohmann::json> independent;  // N processes alone, the slowest one, one per round
};

const char* plan_name(ddp::BucketPlan plan) { return plan == ddp::BucketPlan::kCaps ? "caps" : "adapt"; }

// The models bench/train/pytorch_ddp_bench.py defines as well.
bool pytorch_has_model(const std::string& model) { return model == "cnn" || model == "resnet18"; }

// The DDP options that the PyTorch side script takes, spelled as it spells them.
std::string pytorch_ddp_args(const TrainBenchOptions& options) {
  std::string args = fmt::format("--bucket-cap-mb {}{} --comm-hook {}", options.ddp.bucket_cap_mb,
                                 options.ddp.gradient_as_bucket_view ? " --gradient-as-bucket-view" : "",
                                 options.comm_hook);
  if (options.comm_hook == "powersgd") {
    args += fmt::format(" --powersgd-rank {} --powersgd-start {}", options.powersgd.matrix_approximation_rank,
                        options.powersgd.start_powersgd_iter);
  }
  return args;
}

std::string pytorch_fsdp_args(const fsdp::FsdpOptions& options) {
  return fmt::format("--reshard-after-forward {}", options.reshard_after_forward ? "true" : "false");
}

std::string describe_fsdp(const fsdp::FsdpOptions& options) {
  return fmt::format(", FSDP beside DDP (each direct child a unit, reshard_after_forward {})",
                     options.reshard_after_forward ? "true" : "false");
}

std::string describe_hook(const TrainBenchOptions& options) {
  if (options.comm_hook != "powersgd") return options.comm_hook;
  return fmt::format("powersgd (rank {}, from step {})", options.powersgd.matrix_approximation_rank,
                     options.powersgd.start_powersgd_iter + 1);
}

// The flags PyTorch's DDP has no counterpart for. FSDP2 runs alone there, with no buckets or comm hooks to match.
void check_ddp_flags_have_counterparts(const TrainBenchOptions& bench) {
  if (bench.fsdp) return;
  if (bench.ddp.first_bucket_cap_mb != ddp::DdpOptions{}.first_bucket_cap_mb) {
    throw InvalidArgument("--first-bucket-cap-mb has no counterpart in PyTorch's DDP; drop it with --compare pytorch");
  }
  const ddp::PowerSgdOptions defaults;
  const ddp::PowerSgdOptions& powersgd = bench.powersgd;
  if (bench.comm_hook == "powersgd" &&
      (powersgd.min_compression_rate != defaults.min_compression_rate ||
       powersgd.use_error_feedback != defaults.use_error_feedback || powersgd.warm_start != defaults.warm_start ||
       powersgd.orthogonalization_epsilon != defaults.orthogonalization_epsilon ||
       powersgd.random_seed != defaults.random_seed)) {
    throw InvalidArgument("the PyTorch side takes PowerSGD's rank and start only; keep its other options at their "
                          "defaults with --compare pytorch");
  }
}

// The flags are judged before the script is looked for: a wrong flag is wrong wherever the program runs.
void check_pytorch_can_match(const TrainDriverOptions& options) {
  if (!pytorch_has_model(options.bench.model)) {
    throw InvalidArgument(fmt::format("--compare pytorch has only cnn and resnet18 on the PyTorch side; drop --compare "
                                      "to time --model {}", options.bench.model));
  }
  check_ddp_flags_have_counterparts(options.bench);
  if (!std::filesystem::is_regular_file(options.pytorch_script)) {
    throw InvalidArgument(fmt::format("PyTorch side script {} not found; run from the repository root or pass "
                                      "--pytorch-script", options.pytorch_script));
  }
}

// What would make every worker fail, found before the first one starts.
void check_workers_can_run(const TrainDriverOptions& options) {
  const TrainBenchOptions& bench = options.bench;
  check_model_builds(bench);
  const int most = *std::max_element(options.world_sizes.begin(), options.world_sizes.end());
  if (bench.fsdp && most < 2) {
    throw InvalidArgument("--strategy fsdp shards over ranks, and --world-sizes has none above 1; give e.g. "
                          "--world-sizes 2");
  }
  // At world size N, N independent processes (or the DataParallel process's N replicas) hold their data at once;
  // the rest of memory is left to the models and their activations.
  const double data_bytes = most * train_data_bytes(bench);
  const double memory_bytes = static_cast<double>(host_memory_bytes());
  if (data_bytes > memory_bytes / 2) {
    throw InvalidArgument(fmt::format(
        "--batch-size {} at --image-size {}: the random data of {} process{} take {:.1f} GB, more than half of this "
        "host's {:.1f} GB of memory; lower --batch-size or --image-size",
        bench.batch_size, bench.image_size, most, most > 1 ? "es" : "", data_bytes / 1e9, memory_bytes / 1e9));
  }
  if (options.backend == "mpi" && most > 1 && std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    throw UnsupportedError(
        "--backend mpi starts its DDP jobs with mpirun, which is not on PATH; install Open MPI (on Debian: apt-get "
        "install -y openmpi-bin) or use --backend gloo");
  }
}

std::string format_megabytes(const std::vector<nlohmann::json>& rounds) {
  const double bytes = median_over_rounds(rounds, "bytes_per_step");
  return bytes > 0 ? fmt::format("{:.3f}", bytes / 1e6) : "-";
}

// Starts the workers of one measurement and reads back what they wrote. Each worker is this program again, its
// options one document beside its result file in the result folder.
class TrainRunner {
 public:
  TrainRunner(const TrainDriverOptions& options, std::string python)
      : options_(options),
        python_(std::move(python)),
        env_(fmt::format("OMP_NUM_THREADS={} ", options.threads)),
        // PyTorch's side has no mpi process group here; it uses gloo where tandem uses mpi.
        pytorch_backend_(options.backend == "nccl" ? "nccl" : "gloo") {}

  const std::string& pytorch_backend() const { return pytorch_backend_; }

  // N processes with no communication, started together so they share the cores as the job does; the slowest.
  nlohmann::json independent(int n) const {
    std::string together;
    for (int i = 0; i < n; ++i) {
      together += fmt::format("LOCAL_RANK={} {}{} & pids=\"$pids $!\"; ", i, env_,
                              worker("independent", 1, fmt::format("ind_{}_{}", n, i)));
    }
    // Each one waited for by its pid, so that one that fails (or a Ctrl-C) fails the shell too.
    together += "status=0; for pid in $pids; do wait $pid || status=$?; done; exit $status";
    run_or_throw("sh -c " + shell_quoted(together),
                 n == 1 ? std::string("the independent process") : fmt::format("the {} independent processes", n));
    nlohmann::json slowest;
    for (int i = 0; i < n; ++i) {
      nlohmann::json one = read_result(path(fmt::format("ind_{}_{}.json", n, i)),
                                       fmt::format("independent process {} of {}", i + 1, n));
      if (slowest.is_null() || one["ms_per_step_median"] > slowest["ms_per_step_median"]) slowest = one;
    }
    return slowest;
  }

  // The N-rank job of `mode` (ddp or fsdp), through `tandem run`, or mpirun for mpi.
  nlohmann::json job(const std::string& mode, int n) const {
    const std::string name = fmt::format("{}_{}", mode, n);
    const std::string what = fmt::format("the {}-rank {} job", n, mode == "fsdp" ? "FSDP" : "DDP");
    const std::string ranks =
        options_.backend == "mpi"
            ? fmt::format("mpirun {}-np {} ", ::geteuid() == 0 ? "--allow-run-as-root " : "", n)
            : fmt::format("{} run --nproc-per-node {} -- ", shell_quoted(options_.program), n);
    run_or_throw(env_ + ranks + worker(mode, 1, name), what);
    return read_result(path(name + ".json"), what);
  }

  nlohmann::json data_parallel(int n) const {
    const std::string name = fmt::format("dp_{}", n);
    const std::string what = fmt::format("the DataParallel process with {} replicas", n);
    run_or_throw(env_ + worker("data-parallel", n, name), what);
    return read_result(path(name + ".json"), what);
  }

  // PyTorch's side script: `mode` independent, ddp or fsdp.
  nlohmann::json pytorch(const std::string& mode, int n) const {
    const TrainBenchOptions& bench = options_.bench;
    const bool sharded = bench.fsdp.has_value();
    const std::string what = sharded ? "the PyTorch FSDP2 script" : "the PyTorch DDP script";
    const std::string out = path(fmt::format("py_{}_{}.json", mode, n));
    run_or_throw(fmt::format("{}{} {} --nproc {} --mode {} --model {} --image-size {} --device {} --backend {} "
                             "--data random --batch-size {} --threads {} --steps {} --repeats {} --warmup {} {} > {}",
                             env_, python_, shell_quoted(options_.pytorch_script), n, mode, bench.model,
                             bench.image_size, options_.device, pytorch_backend_, bench.batch_size, options_.threads,
                             bench.steps, bench.repeats, bench.warmup,
                             sharded ? pytorch_fsdp_args(*bench.fsdp) : pytorch_ddp_args(bench), shell_quoted(out)),
                 what);
    return read_result(out, what);
  }

 private:
  std::string path(const std::string& file) const { return (folder_ / file).string(); }

  // The shell words of one worker, which writes its result to NAME.json.
  std::string worker(const std::string& mode, int replicas, const std::string& name) const {
    TrainWorkerOptions worker{mode,           replicas,         path(name + ".json"), options_.device,
                              options_.backend, options_.threads, options_.bench};
    // A worker shards only as a rank of the FSDP job; the driver's other workers of an fsdp run are plain.
    if (mode != "fsdp") worker.bench.fsdp.reset();
    return worker_command(options_.program, "train", worker, folder_ / (name + ".options.json"));
  }

  const TrainDriverOptions& options_;
  const ResultFolder folder_;
  std::string python_;
  std::string env_;
  std::string pytorch_backend_;
};

// The table's rows in order, and the comparisons printed under it.
struct TrainTable {
  std::vector<TrainRow> rows;
  std::vector<TrainRow> data_parallel_rows;  // after all others
  std::vector<std::string> comparisons;
};

// One round of tandem at world size n: the independent processes, then the DDP job and the DataParallel
// process (with fsdp: the FSDP job, in `second`), all compared with the same independent processes.
void tandem_round(const TrainRunner& runner, bool sharded, int n, TrainRow& row, TrainRow& second) {
  const nlohmann::json slowest = runner.independent(n);
  row.independent.push_back(slowest);
  if (n == 1) {
    row.job.push_back(slowest);
    return;
  }
  row.job.push_back(runner.job("ddp", n));
  second.independent.push_back(slowest);
  second.job.push_back(sharded ? runner.job("fsdp", n) : runner.data_parallel(n));
}

// With fsdp, each N > 1 has its FSDP, DDP and PyTorch FSDP2 rows side by side. At N = 1 there is no FSDP job:
// PyTorch's row is compared with the process alone.
void add_sharded_rows(TrainTable& table, int n, TrainRow row, TrainRow fsdp, TrainRow py, bool compare) {
  if (n > 1) {
    table.comparisons.push_back(fmt::format("N={}: tandem FSDP samples/s = {:.3f} x tandem DDP's", n,
                                            paired_ratio(row.job, fsdp.job, "ms_per_step_median")));
  }
  if (compare) {
    table.comparisons.push_back(fmt::format("N={}: tandem {} samples/s = {:.3f} x PyTorch {}'s", n,
                                            n > 1 ? "FSDP" : "(alone)",
                                            paired_ratio(py.job, n > 1 ? fsdp.job : row.job, "ms_per_step_median"),
                                            n > 1 ? "FSDP2" : "(alone)"));
  }
  if (n > 1) table.rows.push_back(std::move(fsdp));
  table.rows.push_back(std::move(row));
  if (compare) table.rows.push_back(std::move(py));
}

// Without fsdp, tandem's and PyTorch's DDP rows alternate (the comparison pairs them) and the DataParallel rows
// follow.
void add_ddp_rows(TrainTable& table, int n, TrainRow row, TrainRow data_parallel, TrainRow py, bool compare) {
  if (compare) {
    table.comparisons.push_back(fmt::format("N={}: tandem samples/s = {:.3f} x PyTorch DDP's", n,
                                            paired_ratio(py.job, row.job, "ms_per_step_median")));
  }
  table.rows.push_back(std::move(row));
  if (compare) table.rows.push_back(std::move(py));
  if (n > 1) table.data_parallel_rows.push_back(std::move(data_parallel));
}

TrainTable measure_rows(const TrainDriverOptions& options, const TrainRunner& runner) {
  const bool sharded = options.bench.fsdp.has_value();
  TrainTable table;
  for (int n : options.world_sizes) {
    TrainRow row{"tandem", n > 1 ? "DDP" : "-", n, {}, {}}, py{"pytorch", sharded ? "FSDP2" : "DDP", n, {}, {}};
    TrainRow second{"tandem", sharded ? "FSDP" : "DP", n, {}, {}};
    for (int round = 0; round < options.rounds; ++round) {
      tandem_round(runner, sharded, n, row, second);
      if (options.compare_pytorch) {
        py.independent.push_back(runner.pytorch("independent", n));
        py.job.push_back(runner.pytorch(sharded ? "fsdp" : "ddp", n));
      }
    }
    (sharded ? add_sharded_rows : add_ddp_rows)(table, n, std::move(row), std::move(second), std::move(py),
                                                options.compare_pytorch);
  }
  table.rows.insert(table.rows.end(), table.data_parallel_rows.begin(), table.data_parallel_rows.end());
  return table;
}

void print_train_header(const TrainDriverOptions& options) {
  const TrainBenchOptions& bench = options.bench;
  const ddp::DdpOptions& ddp_options = bench.ddp;
  const bool sharded = bench.fsdp.has_value();
  fmt::print(stderr,
             "# tandem bench train: {} at {}x{} on {}, batch {} per process, {} thread(s) each, {} round(s) of {} x {} "
             "steps after {} warm-up, backend {}, buckets of {} MiB (first {} MiB, plan {}){}, comm hook {}{}{}\n",
             bench.model, bench.image_size, bench.image_size, options.device, bench.batch_size, options.threads,
             options.rounds, bench.repeats, bench.steps, bench.warmup, options.backend, ddp_options.bucket_cap_mb,
             ddp_options.first_bucket_cap_mb, plan_name(ddp_options.bucket_plan),
             ddp_options.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "",
             describe_hook(bench), sharded ? describe_fsdp(*bench.fsdp) : "",
             options.compare_pytorch ? (sharded ? ", vs PyTorch FSDP2" : ", vs PyTorch DDP") : "");
  // hidden: the share of the gradient all-reduce that ran during backward, from a timeline of the steps (tandem's
  // DDP only); est.hidden: the same share inferred from step times, 1 - (ms - indep ms) / all-reduce ms;
  // MB/step: what the comm hook all-reduced per step on each rank (tandem's DDP only).
  fmt::print("{:>9} {:>7} {:>7} {:>3} {:>10} {:>11} {:>17} {:>13} {:>10} {:>8} {:>10} {:>9}\n", "framework", "wrapper",
             "backend", "N", "samples/s", "ms/step", "spread(min..max)", "indep ms/step", "scaling", "hidden",
             "est.hidden", "MB/step");
}

// Prints one row of the table and returns its JSON entry; `backend` as the table shows it.
nlohmann::json print_train_row(const TrainRow& row, int batch_size, const std::string& backend) {
  const double ms = median_over_rounds(row.job, "ms_per_step_median");
  const double independent_ms = median_over_rounds(row.independent, "ms_per_step_median");
  const double samples = row.world_size * batch_size * 1000.0 / ms;
  const double efficiency = paired_ratio(row.independent, row.job, "ms_per_step_median");
  const double allreduce_ms = median_over_rounds(row.job, "allreduce_ms");
  double fastest = row.job.front()["ms_per_step_min"], slowest = row.job.front()["ms_per_step_max"];
  for (const auto& round : row.job) {
    fastest = std::min(fastest, round["ms_per_step_min"].get<double>());
    slowest = std::max(slowest, round["ms_per_step_max"].get<double>());
  }
  std::string estimated_hidden = "-";
  // FSDP gathers and reduce-scatters rather than all-reduces: the estimate does not apply.
  if (row.world_size > 1 && allreduce_ms > 0 && row.wrapper == "DDP") {
    estimated_hidden =
        fmt::format("{:.0f}%", 100.0 * std::clamp(1.0 - (ms - independent_ms) / allreduce_ms, 0.0, 1.0));
  }
  const bool tandem_ddp = row.framework == "tandem" && row.wrapper == "DDP";
  std::string hidden = "-";
  if (tandem_ddp && row.job.front().value("hidden_share", -1.0) >= 0) {
    hidden = fmt::format("{:.0f}%", 100.0 * median_over_rounds(row.job, "hidden_share"));
  }
  const std::string megabytes = tandem_ddp ? format_megabytes(row.job) : "-";
  fmt::print("{:>9} {:>7} {:>7} {:>3} {:>10.1f} {:>11.2f} {:>17} {:>13.2f} {:>10.3f} {:>8} {:>10} {:>9}\n",
             row.framework, row.wrapper, backend, row.world_size, samples, ms,
             fmt::format("{:.2f}..{:.2f}", fastest, slowest), independent_ms, efficiency, hidden, estimated_hidden,
             megabytes);
  nlohmann::json entry{{"framework", row.framework}, {"wrapper", row.wrapper}, {"backend", backend},
                       {"world_size", row.world_size}, {"samples_per_s", samples}, {"ms_per_step_median", ms},
                       {"independent_ms_per_step", independent_ms}, {"scaling_efficiency", efficiency},
                       {"hidden", hidden}, {"estimated_hidden", estimated_hidden},
                       {"rounds", row.job}, {"independent_rounds", row.independent}};
  if (tandem_ddp) entry["bytes_per_step"] = median_over_rounds(row.job, "bytes_per_step");
  return entry;
}

void write_train_json(const TrainDriverOptions& options, const nlohmann::json& rows) {
  const TrainBenchOptions& bench = options.bench;
  const ddp::DdpOptions& ddp_options = bench.ddp;
  const bool sharded = bench.fsdp.has_value();
  nlohmann::json json{{"benchmark", "train"},  {"model", bench.model},
                      {"image_size", bench.image_size}, {"batch_size", bench.batch_size},
                      {"threads", options.threads},     {"rounds", options.rounds},
                      {"bucket_cap_mb", ddp_options.bucket_cap_mb},
                      {"first_bucket_cap_mb", ddp_options.first_bucket_cap_mb},
                      {"bucket_plan", plan_name(ddp_options.bucket_plan)},
                      {"gradient_as_bucket_view", ddp_options.gradient_as_bucket_view},
                      {"comm_hook", bench.comm_hook},   {"strategy", sharded ? "fsdp" : "ddp"},
                      {"rows", rows}};
  if (sharded) json["reshard_after_forward"] = bench.fsdp->reshard_after_forward;
  if (bench.comm_hook == "powersgd") {
    json["powersgd"] = {{"matrix_approximation_rank", bench.powersgd.matrix_approximation_rank},
                        {"start_powersgd_iter", bench.powersgd.start_powersgd_iter}};
  }
  write_file_atomically(options.json_path, json.dump(2) + "\n");
}

}  // namespace

void run_train_driver(TrainDriverOptions options) {
  // Resolved here once, so that every worker and the PyTorch side run on the same kind of device and backend.
  const torch::Device device = select_device(options.device, 0);
  options.device = device.is_cuda() ? "cuda" : "cpu";
  if (options.backend.empty()) options.backend = comm::default_backend(device);
  const bool compare = options.compare_pytorch;
  check_workers_can_run(options);
  if (compare) check_pytorch_can_match(options);
  // Made before any process starts, so a mistyped hook fails once, here.
  ddp::make_comm_hook(options.bench.comm_hook, options.bench.powersgd);
  if (!options.json_path.empty()) require_writable_file("--json", options.json_path);
  const bool sharded = options.bench.fsdp.has_value();
  std::string python;
  if (compare) python = sharded ? find_python_with_fully_shard("--compare pytorch") : find_python("--compare pytorch");
  const TrainRunner runner(options, python);
  print_train_header(options);
  const TrainTable table = measure_rows(options, runner);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : table.rows) {
    // DataParallel communicates through memory, not a backend.
    const std::string& backend = row.framework == "pytorch" ? runner.pytorch_backend() : options.backend;
    rows.push_back(print_train_row(row, options.bench.batch_size, row.wrapper == "DP" ? "-" : backend));
  }
  for (const std::string& line : table.comparisons) fmt::print("{}\n", line);
  if (!options.json_path.empty()) write_train_json(options, rows);
}

}  // namespace tandem::bench
