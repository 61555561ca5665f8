// `tandem bench`: benchmarks that print tables (and JSON with --json).
//   tandem run --nproc-per-node 2 -- tandem bench allreduce              (gloo, run as every rank)
//   mpirun -np 2 tandem bench allreduce --backend mpi                     (mpi, run as every rank)
//   tandem bench train [--backend mpi] [--compare pytorch]                (starts its own processes)
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <torch/torch.h>
#include <unistd.h>
#include <filesystem>
#include <cstdlib>

#include "apps/command.h"
#include "apps/flag_checks.h"
#include "tandem/bench/allreduce_bench.h"
#include "tandem/bench/train_bench.h"
#include "tandem/comm/backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"

namespace tandem::app {
namespace {

struct AllreduceFlags {
  std::string device = "auto";
  std::string backend;  // empty: nccl on a GPU, gloo on the CPU
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
  init.device = flags.device;
  init.backend = flags.backend;
  init.timeout = std::chrono::seconds(flags.timeout_s);
  ProcessGroup& group = init_process_group(init);
  options.device = group.device();
  comm::Communicator& comm = group.communicator();
  const bool main = is_main_process();
  const unsigned cores = std::thread::hardware_concurrency();

  // The ceiling on one host: one thread copying memory, measured by rank 0 while the others wait, so the
  // figure is the same whatever the world size.
  bench::MemcpyResult copy;
  if (main) copy = bench::measure_memcpy(memcpy_bytes, 10, options.device);
  barrier();

  if (main) {
    fmt::print("# tandem bench allreduce: backend {}, {} ranks, float32 sum in place on {}, host {} ({} cores, {})\n",
               comm.backend_name(), comm.world_size(), options.device.str(), host_name(), cores, cpu_model());
    fmt::print("# sizes {}, iters {}, warmup {}; busbw = algbw * 2(n-1)/n (nccl-tests)\n", flags.sizes,
               flags.iters > 0 ? std::to_string(flags.iters) : "auto", flags.warmup);
    fmt::print("# {} bandwidth ({}{}): {:.2f} GB/s\n", options.device.is_cuda() ? "device-to-device copy" : "memcpy",
               options.device.is_cuda() ? "" : "1 thread, ", bench::format_size(copy.bytes), copy.gbps);
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


struct TrainFlags {
  std::string device = "auto";
  std::string backend;  // empty: nccl on a GPU, gloo on the CPU
  std::string world_sizes = "1,2";
  bench::TrainBenchOptions options;
  int threads = 1;
  int rounds = 1;
  std::string compare;
  std::string pytorch_script = "bench/pytorch_ddp_bench.py";
  std::string json_path;
  // Internal: set when this process is one of the workers the driver started.
  std::string worker_mode;
  int replicas = 1;  // of a data-parallel worker
  std::string result_path;
};

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

nlohmann::json to_json(const bench::TrainBenchResult& result) {
  return {{"ms_per_step_median", result.ms_median}, {"ms_per_step_min", result.ms_min},
          {"ms_per_step_max", result.ms_max},       {"repeats", result.ms_per_step},
          {"allreduce_ms", result.allreduce_ms},    {"parameters", result.parameters},
          {"hidden_share", result.hidden_share}};
}

int run_train_worker(TrainFlags flags) {
  int threads = flags.threads;
  comm::CommunicatorPtr communicator;
  if (flags.worker_mode == "ddp") {
    InitOptions init;
    init.device = flags.device;
    init.backend = flags.backend;
    ProcessGroup& group = init_process_group(init);
    flags.options.device = group.device();
    communicator = group.communicator_ptr();
    if (communicator->world_size() < 2) communicator = nullptr;
  } else if (flags.worker_mode == "data-parallel") {
    // Replica k where rank k of the DDP job would be; the process gets the threads of all N ranks, so each
    // replica's thread has one rank's (DataParallel shares them out) and the backward has all of them.
    for (int k = 0; k < flags.replicas; ++k) {
      flags.options.data_parallel_devices.push_back(select_device(flags.device, k));
    }
    flags.options.device = flags.options.data_parallel_devices.front();
    make_current(flags.options.device);
    threads *= flags.replicas;
  } else {
    // Independent workers are started with LOCAL_RANK set, so that each takes the GPU a rank would.
    const char* local_rank = std::getenv("LOCAL_RANK");
    flags.options.device = select_device(flags.device, local_rank ? std::atoi(local_rank) : 0);
    make_current(flags.options.device);
  }
  torch::set_num_threads(threads);
  bench::TrainBenchResult result = bench::run_train_bench(flags.options, communicator);
  if (is_main_process()) std::ofstream(flags.result_path) << to_json(result).dump() << "\n";
  if (is_initialized()) destroy_process_group();
  return 0;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw CommError(fmt::format("a benchmark worker wrote no result to {}; see its output above", path));
  return nlohmann::json::parse(file);
}

void run_or_throw(const std::string& command, const std::string& what) {
  int status = std::system(command.c_str());
  if (status != 0) throw CommError(fmt::format("{} failed (exit status {}); its command was: {}", what, status, command));
}

// The DDP options that this program's workers and the PyTorch side script both take, spelled alike.
std::string shared_ddp_args(const ddp::DdpOptions& options) {
  return fmt::format("--bucket-cap-mb {}{}", options.bucket_cap_mb,
                     options.gradient_as_bucket_view ? " --gradient-as-bucket-view" : "");
}

// Common flags for a worker of this program.
std::string worker_args(const TrainFlags& flags) {
  const auto& o = flags.options;
  return fmt::format("bench train --model {} --image-size {} --device {} --backend {} --batch-size {} --steps {} "
                     "--repeats {} --warmup {} --threads {} --first-bucket-cap-mb {} {}",
                     o.model, o.image_size, flags.device, flags.backend, o.batch_size, o.steps, o.repeats, o.warmup, flags.threads,
                     o.ddp.first_bucket_cap_mb, shared_ddp_args(o.ddp));
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
  return bench::median_of(values);
}

// Per-round ratio `numerator[field] / denominator[field]`, median over rounds: paired, so a machine that drifts
// between rounds moves both sides of each ratio alike.
double paired_ratio(const std::vector<nlohmann::json>& numerator, const std::vector<nlohmann::json>& denominator,
                    const char* field) {
  std::vector<double> ratios;
  for (size_t r = 0; r < numerator.size(); ++r) {
    ratios.push_back(numerator[r][field].get<double>() / denominator[r][field].get<double>());
  }
  return bench::median_of(ratios);
}

std::string find_python() {
  // PYTHON first (scripts/gpu-check sets it); then Debian's python3-torch, which installs into the system
  // interpreter that a pyenv or venv python3 may shadow.
  std::vector<std::string> candidates{"/usr/bin/python3", "python3"};
  if (const char* chosen = std::getenv("PYTHON")) candidates.insert(candidates.begin(), chosen);
  for (const std::string& candidate : candidates) {
    if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", shell_quoted(candidate)).c_str()) == 0) {
      return shell_quoted(candidate);
    }
  }
  throw UnsupportedError(
      "--compare pytorch needs PyTorch for Python, which is not installed; on Debian: apt-get install -y "
      "python3-torch (the bench installs nothing itself)");
}

// The models bench/pytorch_ddp_bench.py defines as well.
bool pytorch_has_model(const std::string& model) { return model == "cnn" || model == "resnet18"; }

int run_train_driver(TrainFlags flags) {
  // Resolved here once, so that every worker and the PyTorch side run on the same kind of device and backend.
  const torch::Device device = select_device(flags.device, 0);
  flags.device = device.is_cuda() ? "cuda" : "cpu";
  if (flags.backend.empty()) flags.backend = comm::default_backend(device);
  std::vector<int> world_sizes;
  for (int64_t n : bench::parse_sizes(flags.world_sizes)) world_sizes.push_back(static_cast<int>(n));
  const bool compare = flags.compare == "pytorch";
  if (!flags.compare.empty() && !compare) {
    throw InvalidArgument(fmt::format("--compare '{}' is unknown; the only comparison is 'pytorch'", flags.compare));
  }
  if (compare && !pytorch_has_model(flags.options.model)) {
    throw InvalidArgument(fmt::format("--compare pytorch has only cnn and resnet18 on the PyTorch side; drop --compare "
                                      "to time --model {}", flags.options.model));
  }
  if (compare && flags.options.ddp.first_bucket_cap_mb != ddp::DdpOptions{}.first_bucket_cap_mb) {
    throw InvalidArgument("--first-bucket-cap-mb has no counterpart in PyTorch's DDP; drop it with --compare pytorch");
  }
  std::string python = compare ? find_python() : "";
  // PyTorch's side has no mpi process group here; it uses gloo where tandem uses mpi.
  const std::string pytorch_backend = flags.backend == "nccl" ? "nccl" : "gloo";
  if (compare && !std::filesystem::exists(flags.pytorch_script)) {
    throw InvalidArgument(fmt::format("PyTorch side script {} not found; run from the repository root or pass "
                                      "--pytorch-script", flags.pytorch_script));
  }
  std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("tandem_bench_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string self = shell_quoted(self_path());
  const std::string env = fmt::format("OMP_NUM_THREADS={} ", flags.threads);
  const auto& ddp_options = flags.options.ddp;
  fmt::print(stderr,
             "# tandem bench train: {} at {}x{} on {}, batch {} per process, {} thread(s) each, {} round(s) of {} x {} "
             "steps after {} warm-up, backend {}, buckets of {} MiB (first {} MiB){}{}\n",
             flags.options.model, flags.options.image_size, flags.options.image_size, flags.device,
             flags.options.batch_size,
             flags.threads, flags.rounds, flags.options.repeats, flags.options.steps, flags.options.warmup, flags.backend,
             ddp_options.bucket_cap_mb, ddp_options.first_bucket_cap_mb,
             ddp_options.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "",
             compare ? ", vs PyTorch DDP" : "");

  // One round of tandem at world size n: the independent processes, then the DDP job and the DataParallel
  // process, which are both compared with the same independent processes.
  auto tandem_round = [&](int n, TrainRow& row, TrainRow& data_parallel) {
    // N processes with no communication, started together so they share the cores as the job does.
    std::string together;
    for (int i = 0; i < n; ++i) {
      together += fmt::format("LOCAL_RANK={} {}{} {} --worker independent --result {} & ", i, env, self, worker_args(flags),
                              shell_quoted((dir / fmt::format("ind_{}_{}.json", n, i)).string()));
    }
    run_or_throw("sh -c " + shell_quoted(together + "wait"), fmt::format("{} independent processes", n));
    nlohmann::json slowest;
    for (int i = 0; i < n; ++i) {
      nlohmann::json one = read_json((dir / fmt::format("ind_{}_{}.json", n, i)).string());
      if (slowest.is_null() || one["ms_per_step_median"] > slowest["ms_per_step_median"]) slowest = one;
    }
    row.independent.push_back(slowest);
    if (n == 1) {
      row.job.push_back(slowest);
      return;
    }
    std::string result = shell_quoted((dir / fmt::format("ddp_{}.json", n)).string());
    std::string command =
        flags.backend == "mpi"
            ? fmt::format("{}mpirun {}-np {} {} {} --worker ddp --result {}", env,
                          ::geteuid() == 0 ? "--allow-run-as-root " : "", n, self, worker_args(flags), result)
            : fmt::format("{}{} run --nproc-per-node {} -- {} {} --worker ddp --result {}", env, self, n, self,
                          worker_args(flags), result);
    run_or_throw(command, fmt::format("the {}-rank DDP job", n));
    row.job.push_back(read_json((dir / fmt::format("ddp_{}.json", n)).string()));

    result = (dir / fmt::format("dp_{}.json", n)).string();
    run_or_throw(fmt::format("{}{} {} --worker data-parallel --replicas {} --result {}", env, self, worker_args(flags),
                             n, shell_quoted(result)),
                 fmt::format("the DataParallel process with {} replicas", n));
    data_parallel.job.push_back(read_json(result));
    data_parallel.independent.push_back(slowest);
  };
  auto pytorch_round = [&](int n, TrainRow& row) {
    const auto& o = flags.options;
    for (const char* mode : {"independent", "ddp"}) {
      std::string out = (dir / fmt::format("py_{}_{}.json", mode, n)).string();
      run_or_throw(fmt::format("{}{} {} --nproc {} --mode {} --model {} --image-size {} --device {} --backend {} "
                               "--data random --batch-size {} --threads {} --steps {} --repeats {} --warmup {} {} > {}",
                               env, python, shell_quoted(flags.pytorch_script), n, mode, o.model, o.image_size,
                               flags.device, pytorch_backend, o.batch_size, flags.threads, o.steps, o.repeats,
                               o.warmup, shared_ddp_args(o.ddp), shell_quoted(out)),
                   "the PyTorch DDP script");
      (std::string(mode) == "ddp" ? row.job : row.independent).push_back(read_json(out));
    }
  };

  // Tandem's and PyTorch's DDP rows alternate (the comparison below pairs them); the DataParallel rows follow.
  std::vector<TrainRow> rows, data_parallel_rows;
  for (int n : world_sizes) {
    TrainRow row{"tandem", n > 1 ? "DDP" : "-", n, {}, {}}, py{"pytorch", "DDP", n, {}, {}};
    TrainRow dp{"tandem", "DP", n, {}, {}};
    for (int round = 0; round < flags.rounds; ++round) {
      tandem_round(n, row, dp);
      if (compare) pytorch_round(n, py);
    }
    rows.push_back(std::move(row));
    if (compare) rows.push_back(std::move(py));
    if (n > 1) data_parallel_rows.push_back(std::move(dp));
  }
  std::filesystem::remove_all(dir);
  std::vector<TrainRow> table = rows;
  table.insert(table.end(), data_parallel_rows.begin(), data_parallel_rows.end());

  // hidden: the share of the gradient all-reduce that ran during backward, from a timeline of the steps (tandem's
  // DDP only); est.hidden: the same share inferred from step times, 1 - (ms - indep ms) / all-reduce ms.
  fmt::print("{:>9} {:>7} {:>7} {:>3} {:>10} {:>11} {:>17} {:>13} {:>10} {:>8} {:>10}\n", "framework", "wrapper",
             "backend", "N", "samples/s", "ms/step", "spread(min..max)", "indep ms/step", "scaling", "hidden",
             "est.hidden");
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : table) {
    const double ms = median_over_rounds(row.job, "ms_per_step_median");
    const double independent_ms = median_over_rounds(row.independent, "ms_per_step_median");
    const double samples = row.world_size * flags.options.batch_size * 1000.0 / ms;
    const double efficiency = paired_ratio(row.independent, row.job, "ms_per_step_median");
    const double allreduce_ms = median_over_rounds(row.job, "allreduce_ms");
    double fastest = row.job.front()["ms_per_step_min"], slowest = row.job.front()["ms_per_step_max"];
    for (const auto& round : row.job) {
      fastest = std::min(fastest, round["ms_per_step_min"].get<double>());
      slowest = std::max(slowest, round["ms_per_step_max"].get<double>());
    }
    std::string estimated_hidden = "-";
    if (row.world_size > 1 && allreduce_ms > 0) {
      estimated_hidden =
          fmt::format("{:.0f}%", 100.0 * std::clamp(1.0 - (ms - independent_ms) / allreduce_ms, 0.0, 1.0));
    }
    std::string hidden = "-";
    if (row.framework == "tandem" && row.world_size > 1 && row.job.front().value("hidden_share", -1.0) >= 0) {
      hidden = fmt::format("{:.0f}%", 100.0 * median_over_rounds(row.job, "hidden_share"));
    }
    // DataParallel communicates through memory, not a backend.
    std::string backend = row.wrapper == "DP" ? "-" : row.framework == "pytorch" ? pytorch_backend : flags.backend;
    fmt::print("{:>9} {:>7} {:>7} {:>3} {:>10.1f} {:>11.2f} {:>17} {:>13.2f} {:>10.3f} {:>8} {:>10}\n",
               row.framework, row.wrapper, backend, row.world_size, samples, ms,
               fmt::format("{:.2f}..{:.2f}", fastest, slowest), independent_ms, efficiency, hidden, estimated_hidden);
    out.push_back({{"framework", row.framework}, {"wrapper", row.wrapper}, {"backend", backend},
                   {"world_size", row.world_size}, {"samples_per_s", samples}, {"ms_per_step_median", ms},
                   {"independent_ms_per_step", independent_ms}, {"scaling_efficiency", efficiency}, {"hidden", hidden},
                   {"estimated_hidden", estimated_hidden},
                   {"rounds", row.job}, {"independent_rounds", row.independent}});
  }
  if (compare) {
    for (size_t i = 0; i + 1 < rows.size(); i += 2) {
      fmt::print("N={}: tandem samples/s = {:.3f} x PyTorch DDP's\n", rows[i].world_size,
                 paired_ratio(rows[i + 1].job, rows[i].job, "ms_per_step_median"));
    }
  }
  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    if (!file) throw InvalidArgument(fmt::format("cannot write --json file '{}'", flags.json_path));
    file << nlohmann::json{{"benchmark", "train"}, {"model", flags.options.model},
                           {"image_size", flags.options.image_size}, {"batch_size", flags.options.batch_size},
                           {"threads", flags.threads}, {"rounds", flags.rounds}, {"bucket_cap_mb", ddp_options.bucket_cap_mb},
                           {"first_bucket_cap_mb", ddp_options.first_bucket_cap_mb},
                           {"gradient_as_bucket_view", ddp_options.gradient_as_bucket_view}, {"rows", out}}.dump(2) << "\n";
  }
  return 0;
}

const CommandRegistration kBench{
    "bench", "Benchmarks: all-reduce bandwidth per backend, training steps vs PyTorch DDP", [](CLI::App& command) {
      command.require_subcommand(1);
      auto flags = std::make_shared<AllreduceFlags>();
      CLI::App* allreduce = command.add_subcommand(
          "allreduce", "All-reduce algorithm and bus bandwidth per size, beside the host's memcpy bandwidth");
      allreduce->add_option("--device", flags->device, "Where the buffer lives: cpu, cuda (GPU LOCAL_RANK) or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      allreduce->add_option("--backend", flags->backend, "Communication backend (default: nccl on a GPU, gloo on the CPU)")
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
          ->capture_default_str()
          ->check(at_least(1));

      auto train_flags = std::make_shared<TrainFlags>();
      CLI::App* train = command.add_subcommand(
          "train",
          "Training steps per second for world sizes 1 and 2 with DDP and DataParallel, scaling efficiency, overlap; "
          "vs PyTorch DDP");
      train->add_option("--device", train_flags->device, "cpu, cuda or auto (cuda where a GPU is visible)")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      train->add_option("--backend", train_flags->backend, "Communication backend (default: nccl on a GPU, gloo on the CPU)")
          ->check(CLI::IsMember(comm::available_backends()));
      train->add_option("--world-sizes", train_flags->world_sizes, "World sizes to time, e.g. 1,2")
          ->capture_default_str();
      train->add_option("--model", train_flags->options.model, "Registered model to train (as tandem train --model)")
          ->capture_default_str();
      train->add_option("--image-size", train_flags->options.image_size, "Square input size (the CNN takes 28)")
          ->capture_default_str();
      train->add_option("--batch-size", train_flags->options.batch_size, "Samples per process per step")
          ->capture_default_str();
      train->add_option("--steps", train_flags->options.steps, "Timed steps per repeat")->capture_default_str();
      train->add_option("--repeats", train_flags->options.repeats, "Timed repeats (median and spread)")
          ->capture_default_str();
      train->add_option("--warmup", train_flags->options.warmup, "Untimed steps first")->capture_default_str();
      train->add_option("--threads", train_flags->threads, "Intra-op threads per process")->capture_default_str();
      train->add_option("--bucket-cap-mb", train_flags->options.ddp.bucket_cap_mb,
                        "DDP bucket size in MiB (PyTorch's bucket_cap_mb); larger buckets start communicating later")
          ->capture_default_str()
          ->check(greater_than(0));
      train->add_option("--first-bucket-cap-mb", train_flags->options.ddp.first_bucket_cap_mb,
                        "Size of the first DDP bucket in MiB, which starts communicating earliest (tandem only: "
                        "PyTorch fixes it at 1)")
          ->capture_default_str()
          ->check(greater_than(0));
      train->add_flag("--gradient-as-bucket-view", train_flags->options.ddp.gradient_as_bucket_view,
                      "Make each .grad a view into its DDP bucket, saving a copy per step (as PyTorch's option)");
      train->add_option("--rounds", train_flags->rounds,
                        "Run every measurement this many times, interleaved; figures are medians over rounds and "
                        "ratios are paired within a round (steadier on a noisy machine)")
          ->capture_default_str()
          ->check(at_least(1));
      train->add_option("--compare", train_flags->compare, "Also run PyTorch's Python DDP: 'pytorch'");
      train->add_option("--pytorch-script", train_flags->pytorch_script, "The PyTorch side script")
          ->capture_default_str();
      train->add_option("--json", train_flags->json_path, "Also write the results as JSON to this file");
      train->add_option("--worker", train_flags->worker_mode,
                        "(internal) run as a worker: ddp, independent or data-parallel")
          ->group("");
      train->add_option("--replicas", train_flags->replicas, "(internal) replicas of a data-parallel worker")
          ->group("");
      train->add_option("--result", train_flags->result_path, "(internal) worker result file")->group("");

      return [flags, allreduce, train_flags, train]() -> int {
        if (allreduce->parsed()) return run_allreduce(*flags);
        if (train->parsed()) {
          return train_flags->worker_mode.empty() ? run_train_driver(*train_flags) : run_train_worker(*train_flags);
        }
        return 2;
      };
    }};

}  // namespace
}  // namespace tandem::app
