#include "bench/train_driver.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "bench/child_processes.h"
#include "bench/host.h"
#include "tandem/comm/backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {
namespace {

nlohmann::json to_json(const TrainBenchResult& result) {
  return {{"ms_per_step_median", result.ms_median}, {"ms_per_step_min", result.ms_min},
          {"ms_per_step_max", result.ms_max},       {"repeats", result.ms_per_step},
          {"allreduce_ms", result.allreduce_ms},    {"parameters", result.parameters},
          {"hidden_share", result.hidden_share},    {"bytes_per_step", result.bytes_per_step}};
}

// One framework and wrapper at one world size: per round, the measured job and the independent processes that
// it is compared with, run back to back so that both see the machine in the same state.
struct TrainRow {
  std::string framework;
  std::string wrapper;  // DDP: a job of N processes; DP: DataParallel, one process with N replicas
  int world_size = 1;
  std::vector<nlohmann::json> job;          // the measured job, one result per round
  std::vector<nlohmann::json> independent;  // N processes alone, the slowest one, one per round
};

double median_over_rounds(const std::vector<nlohmann::json>& rounds, const char* field) {
  std::vector<double> values;
  for (const auto& round : rounds) values.push_back(round.value(field, 0.0));
  return median_of(values);
}

// Per-round ratio `numerator[field] / denominator[field]`, median over rounds: paired, so a machine that drifts
// between rounds moves both sides of each ratio alike.
double paired_ratio(const std::vector<nlohmann::json>& numerator, const std::vector<nlohmann::json>& denominator,
                    const char* field) {
  std::vector<double> ratios;
  for (size_t r = 0; r < numerator.size(); ++r) {
    ratios.push_back(numerator[r][field].get<double>() / denominator[r][field].get<double>());
  }
  return median_of(ratios);
}

const char* plan_name(ddp::BucketPlan plan) { return plan == ddp::BucketPlan::kCaps ? "caps" : "adapt"; }

// The models bench/pytorch_ddp_bench.py defines as well.
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

}  // namespace

std::vector<int> parse_world_sizes(const std::string& text) {
  std::vector<int> sizes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1 || value > std::numeric_limits<int>::max()) {
      throw InvalidArgument(
          fmt::format("'{}' is not a number of processes; give whole numbers from 1, e.g. 1,2,4", item));
    }
    if (std::find(sizes.begin(), sizes.end(), value) != sizes.end()) {
      throw InvalidArgument(fmt::format("world size {} is given twice; give each once", value));
    }
    sizes.push_back(static_cast<int>(value));
    start = comma + 1;
  }
  return sizes;
}

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
  // PyTorch's side has no mpi process group here; it uses gloo where tandem uses mpi.
  const std::string pytorch_backend = options.backend == "nccl" ? "nccl" : "gloo";
  const ResultFolder dir;
  const std::string self = shell_quoted(options.program);
  const std::string env = fmt::format("OMP_NUM_THREADS={} ", options.threads);
  const TrainBenchOptions& bench = options.bench;
  const auto& ddp_options = bench.ddp;
  auto worker = [&](const std::string& mode, int replicas, const std::filesystem::path& result) {
    return self + " " + options.worker_arguments(options, mode, replicas, shell_quoted(result.string()));
  };
  fmt::print(stderr,
             "# tandem bench train: {} at {}x{} on {}, batch {} per process, {} thread(s) each, {} round(s) of {} x {} "
             "steps after {} warm-up, backend {}, buckets of {} MiB (first {} MiB, plan {}){}, comm hook {}{}{}\n",
             bench.model, bench.image_size, bench.image_size, options.device, bench.batch_size, options.threads,
             options.rounds, bench.repeats, bench.steps, bench.warmup, options.backend, ddp_options.bucket_cap_mb,
             ddp_options.first_bucket_cap_mb, plan_name(ddp_options.bucket_plan),
             ddp_options.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "",
             describe_hook(bench), sharded ? describe_fsdp(*bench.fsdp) : "",
             compare ? (sharded ? ", vs PyTorch FSDP2" : ", vs PyTorch DDP") : "");

  auto job_command = [&](const std::string& mode, int n, const std::filesystem::path& result) {
    if (options.backend == "mpi") {
      return fmt::format("{}mpirun {}-np {} {}", env, ::geteuid() == 0 ? "--allow-run-as-root " : "", n,
                         worker(mode, 1, result));
    }
    return fmt::format("{}{} run --nproc-per-node {} -- {}", env, self, n, worker(mode, 1, result));
  };
  // One round of tandem at world size n: the independent processes, then the DDP job and the DataParallel
  // process (with fsdp: the FSDP job), all compared with the same independent processes.
  auto tandem_round = [&](int n, TrainRow& row, TrainRow& second) {
    // N processes with no communication, started together so they share the cores as the job does.
    std::string together;
    for (int i = 0; i < n; ++i) {
      together += fmt::format("LOCAL_RANK={} {}{} & pids=\"$pids $!\"; ", i, env,
                              worker("independent", 1, dir / fmt::format("ind_{}_{}.json", n, i)));
    }
    // Each one waited for by its pid, so that one that fails (or a Ctrl-C) fails the shell too.
    together += "status=0; for pid in $pids; do wait $pid || status=$?; done; exit $status";
    run_or_throw("sh -c " + shell_quoted(together),
                 n == 1 ? std::string("the independent process") : fmt::format("the {} independent processes", n));
    nlohmann::json slowest;
    for (int i = 0; i < n; ++i) {
      nlohmann::json one = read_result((dir / fmt::format("ind_{}_{}.json", n, i)).string(),
                                       fmt::format("independent process {} of {}", i + 1, n));
      if (slowest.is_null() || one["ms_per_step_median"] > slowest["ms_per_step_median"]) slowest = one;
    }
    row.independent.push_back(slowest);
    if (n == 1) {
      row.job.push_back(slowest);
      return;
    }
    const auto result = dir / fmt::format("ddp_{}.json", n);
    run_or_throw(job_command("ddp", n, result), fmt::format("the {}-rank DDP job", n));
    row.job.push_back(read_result(result.string(), fmt::format("the {}-rank DDP job", n)));

    second.independent.push_back(slowest);
    if (sharded) {
      const auto fsdp_result = dir / fmt::format("fsdp_{}.json", n);
      run_or_throw(job_command("fsdp", n, fsdp_result), fmt::format("the {}-rank FSDP job", n));
      second.job.push_back(read_result(fsdp_result.string(), fmt::format("the {}-rank FSDP job", n)));
      return;
    }
    const auto dp_result = dir / fmt::format("dp_{}.json", n);
    run_or_throw(env + worker("data-parallel", n, dp_result),
                 fmt::format("the DataParallel process with {} replicas", n));
    second.job.push_back(
        read_result(dp_result.string(), fmt::format("the DataParallel process with {} replicas", n)));
  };
  const std::string pytorch_mode = sharded ? "fsdp" : "ddp";
  const std::string pytorch_what = sharded ? "the PyTorch FSDP2 script" : "the PyTorch DDP script";
  const std::string pytorch_args = sharded ? pytorch_fsdp_args(*bench.fsdp) : pytorch_ddp_args(bench);
  auto pytorch_round = [&](int n, TrainRow& row) {
    for (const std::string& mode : {std::string("independent"), pytorch_mode}) {
      std::string out = (dir / fmt::format("py_{}_{}.json", mode, n)).string();
      run_or_throw(fmt::format("{}{} {} --nproc {} --mode {} --model {} --image-size {} --device {} --backend {} "
                               "--data random --batch-size {} --threads {} --steps {} --repeats {} --warmup {} {} > {}",
                               env, python, shell_quoted(options.pytorch_script), n, mode, bench.model,
                               bench.image_size, options.device, pytorch_backend, bench.batch_size, options.threads,
                               bench.steps, bench.repeats, bench.warmup, pytorch_args, shell_quoted(out)),
                   pytorch_what);
      (mode == pytorch_mode ? row.job : row.independent).push_back(read_result(out, pytorch_what));
    }
  };

  // Without fsdp, tandem's and PyTorch's DDP rows alternate (the comparison below pairs them) and the
  // DataParallel rows follow. With fsdp, each N > 1 has its FSDP, DDP and PyTorch FSDP2 rows side by side.
  std::vector<TrainRow> rows, data_parallel_rows, table;
  std::vector<std::string> comparisons;
  for (int n : options.world_sizes) {
    TrainRow row{"tandem", n > 1 ? "DDP" : "-", n, {}, {}}, py{"pytorch", sharded ? "FSDP2" : "DDP", n, {}, {}};
    TrainRow second{"tandem", sharded ? "FSDP" : "DP", n, {}, {}};
    for (int round = 0; round < options.rounds; ++round) {
      tandem_round(n, row, second);
      if (compare) pytorch_round(n, py);
    }
    if (sharded) {
      if (n > 1) {
        comparisons.push_back(fmt::format("N={}: tandem FSDP samples/s = {:.3f} x tandem DDP's", n,
                                          paired_ratio(row.job, second.job, "ms_per_step_median")));
        table.push_back(second);
      }
      table.push_back(row);
      if (compare) {
        comparisons.push_back(fmt::format("N={}: tandem {} samples/s = {:.3f} x PyTorch {}'s", n,
                                          n > 1 ? "FSDP" : "(alone)",
                                          paired_ratio(py.job, n > 1 ? second.job : row.job, "ms_per_step_median"),
                                          n > 1 ? "FSDP2" : "(alone)"));
        table.push_back(std::move(py));
      }
      continue;
    }
    if (compare) {
      comparisons.push_back(fmt::format("N={}: tandem samples/s = {:.3f} x PyTorch DDP's", n,
                                        paired_ratio(py.job, row.job, "ms_per_step_median")));
    }
    rows.push_back(std::move(row));
    if (compare) rows.push_back(std::move(py));
    if (n > 1) data_parallel_rows.push_back(std::move(second));
  }
  table.insert(table.end(), rows.begin(), rows.end());
  table.insert(table.end(), data_parallel_rows.begin(), data_parallel_rows.end());

  // hidden: the share of the gradient all-reduce that ran during backward, from a timeline of the steps (tandem's
  // DDP only); est.hidden: the same share inferred from step times, 1 - (ms - indep ms) / all-reduce ms;
  // MB/step: what the comm hook all-reduced per step on each rank (tandem's DDP only).
  fmt::print("{:>9} {:>7} {:>7} {:>3} {:>10} {:>11} {:>17} {:>13} {:>10} {:>8} {:>10} {:>9}\n", "framework", "wrapper",
             "backend", "N", "samples/s", "ms/step", "spread(min..max)", "indep ms/step", "scaling", "hidden",
             "est.hidden", "MB/step");
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : table) {
    const double ms = median_over_rounds(row.job, "ms_per_step_median");
    const double independent_ms = median_over_rounds(row.independent, "ms_per_step_median");
    const double samples = row.world_size * bench.batch_size * 1000.0 / ms;
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
    // DataParallel communicates through memory, not a backend.
    std::string backend = row.wrapper == "DP" ? "-" : row.framework == "pytorch" ? pytorch_backend : options.backend;
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
    out.push_back(entry);
  }
  for (const std::string& line : comparisons) fmt::print("{}\n", line);
  if (!options.json_path.empty()) {
    nlohmann::json json{{"benchmark", "train"},  {"model", bench.model},
                        {"image_size", bench.image_size}, {"batch_size", bench.batch_size},
                        {"threads", options.threads},     {"rounds", options.rounds},
                        {"bucket_cap_mb", ddp_options.bucket_cap_mb},
                        {"first_bucket_cap_mb", ddp_options.first_bucket_cap_mb},
                        {"bucket_plan", plan_name(ddp_options.bucket_plan)},
                        {"gradient_as_bucket_view", ddp_options.gradient_as_bucket_view},
                        {"comm_hook", bench.comm_hook},   {"strategy", sharded ? "fsdp" : "ddp"},
                        {"rows", out}};
    if (sharded) json["reshard_after_forward"] = bench.fsdp->reshard_after_forward;
    if (bench.comm_hook == "powersgd") {
      json["powersgd"] = {{"matrix_approximation_rank", bench.powersgd.matrix_approximation_rank},
                          {"start_powersgd_iter", bench.powersgd.start_powersgd_iter}};
    }
    write_file_atomically(options.json_path, json.dump(2) + "\n");
  }
}

void run_train_worker(TrainWorkerOptions options) {
  // The independent workers are started in the background of `sh -c`, which starts them with SIGINT ignored:
  // Ctrl-C must stop them as it stops the other workers, so that the driver sees them fail and ends.
  std::signal(SIGINT, SIG_DFL);
  int threads = options.threads;
  TrainBenchOptions& bench = options.bench;
  comm::CommunicatorPtr communicator;
  if (options.mode == "ddp" || options.mode == "fsdp") {
    InitOptions init;
    init.device = options.device;
    init.backend = options.backend;
    ProcessGroup& group = init_process_group(init);
    bench.device = group.device();
    communicator = group.communicator_ptr();
    if (communicator->world_size() < 2) communicator = nullptr;
  } else if (options.mode == "data-parallel") {
    // Replica k where rank k of the DDP job would be; the process gets the threads of all N ranks, so each
    // replica's thread has one rank's (DataParallel shares them out) and the backward has all of them.
    for (int k = 0; k < options.replicas; ++k) bench.data_parallel_devices.push_back(select_device(options.device, k));
    bench.device = bench.data_parallel_devices.front();
    make_current(bench.device);
    threads *= options.replicas;
  } else {
    // Independent workers are started with LOCAL_RANK set, so that each takes the GPU a rank would.
    const char* local_rank = std::getenv("LOCAL_RANK");
    bench.device = select_device(options.device, local_rank ? std::atoi(local_rank) : 0);
    make_current(bench.device);
  }
  torch::set_num_threads(threads);
  TrainBenchResult result = run_train_bench(bench, communicator);
  if (is_main_process()) std::ofstream(options.result_path) << to_json(result).dump() << "\n";
  if (is_initialized()) destroy_process_group();
}

}  // namespace tandem::bench
