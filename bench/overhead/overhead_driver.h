#pragma once
// `tandem bench overhead` as a whole. For each round, back to back so that every measurement of a round sees
// the machine in the same state, the driver starts: one plain LibTorch process (no DDP); for each world size N
// and backend, an N-rank DDP job of this same program (through `tandem run`, or mpirun for mpi); and with
// compare_pytorch, bench/overhead/pytorch_overhead_bench.py's plain step and its DDP over gloo at each N. Each worker
// writes its OverheadBenchResult as JSON. The table has one row per framework, wrapper, backend and N (medians
// over rounds) and each tandem row's ratio to PyTorch's row of the same wrapper and N, paired within a round.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/overhead/overhead_bench.h"

namespace tandem::bench {

struct OverheadDriverOptions {
  OverheadBenchOptions bench;
  std::vector<int> world_sizes{1, 2};
  // Backends of tandem's DDP rows; empty: gloo, and mpi where this build has it and mpirun is on PATH.
  std::vector<std::string> backends;
  int rounds = 3;
  bool compare_pytorch = true;
  std::string pytorch_script = "bench/overhead/pytorch_overhead_bench.py";
  std::string json_path;  // empty: no JSON
  std::string program;    // this program: the workers (overhead_worker.h), and `run`, which starts a gloo job
};

// One row of the table: every round's result of one framework, wrapper ("plain" or "DDP"), backend and N.
struct OverheadRow {
  std::string framework;  // tandem or pytorch
  std::string wrapper;
  std::string backend;  // "-" for plain
  int world_size = 1;
  std::vector<nlohmann::json> rounds;  // each with us_per_step_median and allreduce_us
};

// The median over rounds of `tandem`'s µs per step over `pytorch`'s, each round's pair divided first, so that a
// machine that drifts between rounds moves both sides of each ratio alike. Both rows must hold the same rounds.
double paired_overhead_ratio(const OverheadRow& tandem, const OverheadRow& pytorch);

// "gloo,mpi" -> {"gloo", "mpi"}: backends this build has, each once. Throws InvalidArgument on anything else.
std::vector<std::string> parse_overhead_backends(const std::string& text);

// Checks every setting before the first worker starts (InvalidArgument, UnsupportedError), then runs the
// rounds, prints the table and writes the JSON. CommError when a worker fails; the workers' result files live in
// a temporary folder that is removed however the driver ends.
void run_overhead_driver(OverheadDriverOptions options);

}  // namespace tandem::bench
