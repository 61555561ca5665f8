// The interaction matrix: every row of docs/interactions.md's table of cells runs here as real processes on
// loopback (`tandem run ... -- tandem train ...`, a deadline each) and asserts what its last column says. The
// table is read from the docs at run time, so the docs and the test cannot drift; a second test checks that the
// rows cover every pair of the factors' values.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/version.h>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "tandem/amp/autocast.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/batch_sampler.h"

namespace tandem::testing {
namespace {

const std::string kDocPath = std::string(TANDEM_FIXTURE_DIR) + "/../../docs/interactions.md";
constexpr int64_t kBatch = 4;
constexpr int kEpochs = 2;

// The factors in the cells table's column order (after the cell number), with their values from the docs.
const std::vector<std::string> kFactors{"ranks", "strategy", "precision", "uneven", "accumulate",
                                        "comm hook", "sync-bn", "resume", "recovery", "optimizer"};

struct Cell {
  int id = 0;
  std::map<std::string, std::string> values;  // factor -> value
  std::string expected;                       // "trains" or "refused: <text of the one line>"

  const std::string& at(const std::string& factor) const { return values.at(factor); }
  int ranks() const { return std::stoi(at("ranks")); }
  int accumulate() const { return std::stoi(at("accumulate")); }
  bool uneven() const { return at("uneven") == "on"; }
  bool kill() const { return at("resume") == "kill"; }
  bool reshape() const { return at("resume") == "reshape"; }
  bool in_job() const { return at("recovery") == "in-job"; }
  // Where a reshape cell continues: 2 and 3 ranks (or dp replicas) swap.
  int other_ranks() const { return ranks() == 2 ? 3 : 2; }
  bool data_parallel() const { return at("strategy") == "dp"; }
  bool refused() const { return expected.rfind("refused: ", 0) == 0; }
};

void PrintTo(const Cell& cell, std::ostream* out) { *out << "cell " << cell.id; }

std::vector<std::string> table_row(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line.substr(1));
  std::string cell;
  while (std::getline(in, cell, '|')) {
    const size_t first = cell.find_first_not_of(' '), last = cell.find_last_not_of(' ');
    cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
  }
  return cells;
}

// The rows of the table under `heading` in docs/interactions.md, header and separator left out.
std::vector<std::vector<std::string>> doc_table(const std::string& heading) {
  std::ifstream in(kDocPath);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool inside = false;
  int row = 0;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) inside = line == "## " + heading;
    if (!inside || line.rfind("| ", 0) != 0) continue;
    if (row++ >= 2) rows.push_back(table_row(line));
  }
  return rows;
}

std::vector<Cell> read_cells() {
  std::vector<Cell> cells;
  for (const auto& row : doc_table("Cells")) {
    if (row.size() != kFactors.size() + 2) continue;
    Cell cell;
    cell.id = std::stoi(row[0]);
    for (size_t f = 0; f < kFactors.size(); ++f) cell.values[kFactors[f]] = row[f + 1];
    cell.expected = row.back();
    cells.push_back(cell);
  }
  return cells;
}

// factor -> its values, from the docs' table of factors.
std::map<std::string, std::vector<std::string>> read_factors() {
  std::map<std::string, std::vector<std::string>> factors;
  for (const auto& row : doc_table("Factors")) {
    std::stringstream values(row.at(1));
    std::string value;
    while (std::getline(values, value, ',')) factors[row[0]].push_back(value.substr(value.find_first_not_of(' ')));
  }
  return factors;
}

bool float16_autocast_on_cpu() {
  try {
    amp::require_autocast(torch::kCPU, torch::kHalf);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// This rank's optimizer steps per epoch, as the loop cuts them (loop.cpp: make_loaders, train_epoch).
int64_t steps_per_epoch(int64_t samples, int world, int rank, bool uneven, int accumulate) {
  data::DistributedSamplerOptions options{world, rank, true, 3, false, uneven};
  const data::BatchSampler batches(data::DistributedSampler(samples, options), kBatch, /*drop_last=*/!uneven,
                                   uneven ? data::SingleSampleTail::kMergeIntoPrevious : data::SingleSampleTail::kKeep);
  return (batches.num_batches() + accumulate - 1) / accumulate;
}

// 40 samples; with uneven inputs the smallest size from 40 on at which the first and the last rank get different
// numbers of steps, so that some rank really shadows.
int64_t training_samples(const Cell& cell) {
  if (!cell.uneven() || cell.data_parallel()) return 40;
  for (int64_t samples = 40;; ++samples) {
    if (steps_per_epoch(samples, cell.ranks(), 0, true, cell.accumulate()) !=
        steps_per_epoch(samples, cell.ranks(), cell.ranks() - 1, true, cell.accumulate())) {
      return samples;
    }
  }
}

std::string quoted(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& word : words) line += " '" + word + "'";
  return line;
}

struct CellRun {
  std::vector<std::string> launcher_args;
  std::vector<std::string> train_args;
};

// `ranks`: the cell's own, or the other number a reshape continues on.
CellRun command_for(const Cell& cell, const std::string& data, const std::string& weights, int ranks) {
  CellRun run;
  run.launcher_args = {"--nproc-per-node", cell.data_parallel() ? "1" : std::to_string(ranks)};
  if (cell.kill()) run.launcher_args.insert(run.launcher_args.end(), {"--max-restarts", "1"});
  if (cell.in_job()) run.launcher_args.insert(run.launcher_args.end(), {"--recovery", "in-job"});
  run.train_args = {"--data", data, "--model", cell.data_parallel() ? "cnn" : "cnn-bn", "--epochs",
                    std::to_string(kEpochs), "--batch-size", std::to_string(kBatch), "--threads", "1", "--seed", "3",
                    "--timeout", "60", "--optimizer", cell.at("optimizer")};
  // fsdp's ranks hold different shards, no replicas to compare, and dp's one process copies its replicas from its
  // model at every step (both refusals are rows of bad_train_flags_test).
  if (cell.at("strategy") == "fsdp") {
    run.train_args.insert(run.train_args.end(), {"--strategy", "fsdp"});
  } else if (cell.at("strategy") == "fsdp-sharded") {
    run.train_args.insert(run.train_args.end(), {"--strategy", "fsdp", "--checkpoint-format", "sharded"});
  } else if (!cell.data_parallel()) {
    run.train_args.insert(run.train_args.end(), {"--check-replicas-every", "1"});
  }
  run.train_args.insert(run.train_args.end(),
                        {"--precision", cell.at("precision"), "--accumulate-batches", std::to_string(cell.accumulate()),
                         "--comm-hook", cell.at("comm hook"), "--no-tensorboard", "--no-report", "--save-weights",
                         weights});
  // Only the powersgd hook reads its start step (the others refuse it).
  if (cell.at("comm hook") == "powersgd") run.train_args.insert(run.train_args.end(), {"--powersgd-start", "2"});
  if (cell.data_parallel()) {
    run.train_args.insert(run.train_args.end(), {"--strategy", "dp", "--dp-replicas", std::to_string(ranks)});
  }
  if (cell.at("strategy") == "zero") run.train_args.push_back("--zero");
  if (cell.uneven()) run.train_args.push_back("--uneven");
  if (cell.at("sync-bn") == "on") run.train_args.push_back("--sync-bn");
  // Inside an epoch the newest checkpoint is then at most a step behind; uneven runs checkpoint at epoch ends.
  if (cell.kill() && !cell.uneven()) run.train_args.insert(run.train_args.end(), {"--checkpoint-every", "2"});
  // Both parts of a reshape share the launcher's run id, so the second finds the first's run dir as a restarted
  // job would.
  if (cell.reshape()) {
    run.launcher_args.insert(run.launcher_args.end(), {"--run-id", "matrix-cell" + std::to_string(cell.id)});
  }
  return run;
}

CellRun command_for(const Cell& cell, const std::string& data, const std::string& weights) {
  return command_for(cell, data, weights, cell.ranks());
}

// The first step of epoch 1, where a reshape cell's first part stops (`--steps`).
int64_t reshape_stop(const Cell& cell) {
  return steps_per_epoch(training_samples(cell), cell.data_parallel() ? 1 : cell.ranks(), 0, cell.uneven(),
                         cell.accumulate()) +
         1;
}

// Runs `tandem run ... -- tandem train ...` in `cwd`, where the run dirs go (no --run-dir: a restarted attempt
// must find the first attempt's run by the launcher's run id).
ProcessResult run_cell(const std::string& cwd, const CellRun& run, const std::map<std::string, std::string>& env = {}) {
  const std::string command = "cd '" + cwd + "' && exec '" + tandem_cli() + "' run" + quoted(run.launcher_args) +
                              " -- '" + tandem_cli() + "' train" + quoted(run.train_args);
  return run_process({"sh", "-c", command}, env, std::chrono::seconds(150));
}

double largest_difference(const std::string& expected_path, const std::string& actual_path) {
  const checkpoint::TensorFile expected = checkpoint::load_safetensors(expected_path);
  const checkpoint::TensorFile actual = checkpoint::load_safetensors(actual_path);
  EXPECT_EQ(expected.tensors.size(), actual.tensors.size());
  double largest = 0;
  for (size_t i = 0; i < std::min(expected.tensors.size(), actual.tensors.size()); ++i) {
    EXPECT_EQ(expected.tensors[i].first, actual.tensors[i].first);
    const torch::Tensor& a = expected.tensors[i].second;
    const torch::Tensor& b = actual.tensors[i].second;
    if (!a.sizes().equals(b.sizes())) return INFINITY;
    largest = std::max(largest, (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>());
  }
  return largest;
}

class InteractionMatrix : public ::testing::TestWithParam<Cell> {};

TEST_P(InteractionMatrix, CellDoesWhatTheDocsSay) {
  const Cell& cell = GetParam();
  const std::string name = "matrix_cell" + std::to_string(cell.id);
  const std::string data = write_tiny_mnist(name + "_data", static_cast<int>(training_samples(cell)), 12);
  const std::string root = make_temp_dir(name);
  std::filesystem::create_directories(root + "/whole");
  CellRun whole_run = command_for(cell, data, root + "/whole.safetensors");
  // A reshape cell's first part is its stopped run (the continued run then trains to the end).
  if (cell.reshape()) whole_run.train_args.insert(whole_run.train_args.end(), {"--steps", std::to_string(reshape_stop(cell))});

  std::string refusal = cell.refused() ? cell.expected.substr(std::string("refused: ").size()) : "";
  // The two values that depend on the build (docs/interactions.md).
  if (!cell.refused() && cell.at("precision") == "16-mixed" && !float16_autocast_on_cpu()) {
    refusal = "is not supported";
  } else if (!cell.refused() && cell.at("comm hook") == "bf16" && TORCH_VERSION_MAJOR < 2) {
    refusal = "--comm-hook bf16 needs a backend that reduces bfloat16";
  }
  const ProcessResult whole = run_cell(root + "/whole", whole_run);
  ASSERT_FALSE(whole.timed_out) << whole.output;
  if (!refusal.empty()) {
    EXPECT_NE(whole.exit_code, 0) << whole.output;
    EXPECT_EQ(whole.term_signal, 0) << whole.output;
    EXPECT_NE(whole.output.find(refusal), std::string::npos) << "expected the one line '" << refusal << "':\n"
                                                              << whole.output;
    EXPECT_EQ(whole.output.find("[epoch 0]"), std::string::npos) << "refused before the first step:\n" << whole.output;
    return;
  }
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_NE(whole.output.find("[epoch 1]"), std::string::npos) << whole.output;

  if (cell.reshape()) {
    const ProcessResult continued =
        run_cell(root + "/whole", command_for(cell, data, root + "/continued.safetensors", cell.other_ranks()));
    ASSERT_FALSE(continued.timed_out) << continued.output;
    ASSERT_EQ(continued.exit_code, 0) << continued.output;
    EXPECT_NE(continued.output.find("resuming from"), std::string::npos) << continued.output;
    EXPECT_NE(continued.output.find("[epoch 1]"), std::string::npos) << continued.output;
    if (cell.data_parallel()) {
      // One process on the whole batch, all the epochs.
      CellRun reference = command_for(cell, data, root + "/reference.safetensors");
      const auto strategy = std::find(reference.train_args.begin(), reference.train_args.end(), "--strategy");
      reference.train_args.erase(strategy, strategy + 4);  // --strategy dp --dp-replicas N
      reference.launcher_args.resize(2);                   // no --run-id: a run of its own
      std::filesystem::create_directories(root + "/reference");
      const ProcessResult one = run_cell(root + "/reference", reference);
      ASSERT_EQ(one.exit_code, 0) << one.output;
      const double difference = largest_difference(root + "/reference.safetensors", root + "/continued.safetensors");
      std::printf("cell %d: stopped at step %lld on %d replicas, continued on %d; largest difference from one "
                  "process on the whole batch %g\n",
                  cell.id, static_cast<long long>(reshape_stop(cell)), cell.ranks(), cell.other_ranks(), difference);
      EXPECT_LE(difference, cell.at("precision") == "32" ? 1e-4 : 2e-2);
    } else {
      const std::string moved = "continues on " + std::to_string(cell.other_ranks()) + " ranks";
      EXPECT_NE(continued.output.find(moved), std::string::npos) << continued.output;
      EXPECT_NE(continued.output.find("the learning rate's scale goes from"), std::string::npos) << continued.output;
    }
  } else if (cell.kill()) {
    // Killed inside epoch 1, at its second step: rank 1, or under uneven inputs rank 0 (the one rank that never
    // shadows, so it surely reaches that step in its own training); dp's one process.
    const int64_t samples = training_samples(cell);
    const int64_t first_epoch = steps_per_epoch(samples, cell.data_parallel() ? 1 : cell.ranks(), 0, cell.uneven(),
                                                cell.accumulate());
    const std::string kill_at = "step:" + std::string(cell.data_parallel() || cell.uneven() ? "0" : "1") + ":" +
                                std::to_string(first_epoch + 2);
    std::filesystem::create_directories(root + "/killed");
    const ProcessResult killed =
        run_cell(root + "/killed", command_for(cell, data, root + "/killed.safetensors"), {{"TANDEM_KILL_AT", kill_at}});
    ASSERT_FALSE(killed.timed_out) << killed.output;
    ASSERT_EQ(killed.exit_code, 0) << killed.output;
    EXPECT_NE(killed.output.find("restart 1 of 1"), std::string::npos) << killed.output;
    if (cell.in_job()) {
      // The others went on without rank 1 (the replica check at every step held), on fewer ranks: nothing is
      // read back, and the trajectory is not the uninterrupted one's.
      EXPECT_NE(killed.output.find("go on without it (in-job recovery)"), std::string::npos) << killed.output;
      EXPECT_EQ(killed.output.find("resuming from"), std::string::npos) << killed.output;
      return;
    }
    EXPECT_NE(killed.output.find("resuming from"), std::string::npos)
        << "the restarted attempt must continue the first one's run:\n" << killed.output;
    const double difference = largest_difference(root + "/whole.safetensors", root + "/killed.safetensors");
    std::printf("cell %d: killed at %s and continued; largest difference from the uninterrupted run %g\n", cell.id,
                kill_at.c_str(), difference);
    // PowerSGD's state is not in checkpoints (docs/interactions.md): the continued run says so instead.
    if (cell.at("comm hook") == "powersgd") {
      EXPECT_NE(killed.output.find("PowerSGD's error feedback and warm-start state are not in checkpoints"),
                std::string::npos) << killed.output;
    } else {
      EXPECT_EQ(difference, 0.0) << "resume must be bit-identical";
    }
  } else if (cell.data_parallel()) {
    // One process training the whole batch itself.
    CellRun reference = whole_run;
    const auto strategy = std::find(reference.train_args.begin(), reference.train_args.end(), "--strategy");
    reference.train_args.erase(strategy, strategy + 4);  // --strategy dp --dp-replicas N
    reference.train_args.back() = root + "/reference.safetensors";
    std::filesystem::create_directories(root + "/reference");
    const ProcessResult one = run_cell(root + "/reference", reference);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const double difference = largest_difference(root + "/reference.safetensors", root + "/whole.safetensors");
    std::printf("cell %d: largest difference from one process on the whole batch %g\n", cell.id, difference);
    EXPECT_LE(difference, cell.at("precision") == "32" ? 1e-4 : 2e-2);
  }
}

std::string cell_name(const ::testing::TestParamInfo<Cell>& info) { return "cell" + std::to_string(info.param.id); }

INSTANTIATE_TEST_SUITE_P(Docs, InteractionMatrix, ::testing::ValuesIn(read_cells()), cell_name);

using Pair = std::pair<std::pair<std::string, std::string>, std::pair<std::string, std::string>>;

std::set<Pair> pairs_of(const Cell& cell) {
  std::set<Pair> pairs;
  for (size_t a = 0; a < kFactors.size(); ++a) {
    for (size_t b = a + 1; b < kFactors.size(); ++b) {
      pairs.insert({{kFactors[a], cell.at(kFactors[a])}, {kFactors[b], cell.at(kFactors[b])}});
    }
  }
  return pairs;
}

// Every pair of values trains together in some cell, or is refused by a cell that differs from the first (the
// plainest) cell in that pair's factors only, so the refusal is that pair's. Pairs with neither build-dependent
// value (16-mixed, the bf16 hook) are covered by cells that train on every build.
TEST(InteractionMatrix, CellsCoverEveryPairOfTheFactorsValues) {
  const std::vector<Cell> cells = read_cells();
  const auto factors = read_factors();
  ASSERT_FALSE(cells.empty()) << "no cells read from " << kDocPath;
  ASSERT_EQ(factors.size(), kFactors.size()) << kDocPath;
  std::set<Pair> trained, trained_on_every_build, refused;
  for (const Cell& cell : cells) {
    for (const auto& factor : kFactors) {
      const auto& values = factors.at(factor);
      EXPECT_NE(std::find(values.begin(), values.end(), cell.at(factor)), values.end())
          << "cell " << cell.id << ": " << factor << " " << cell.at(factor) << " is not among the factor's values";
    }
    if (!cell.refused()) {
      for (const Pair& pair : pairs_of(cell)) {
        trained.insert(pair);
        if (cell.at("precision") != "16-mixed" && cell.at("comm hook") != "bf16") trained_on_every_build.insert(pair);
      }
      continue;
    }
    std::vector<std::string> changed;
    for (const auto& factor : kFactors) {
      if (cell.at(factor) != cells.front().at(factor)) changed.push_back(factor);
    }
    ASSERT_LE(changed.size(), 2u) << "refused cell " << cell.id << " differs from cell 1 in more than one pair";
    for (const Pair& pair : pairs_of(cell)) {
      if (std::find(changed.begin(), changed.end(), pair.first.first) != changed.end() &&
          (changed.size() == 1 || std::find(changed.begin(), changed.end(), pair.second.first) != changed.end())) {
        refused.insert(pair);
      }
    }
  }
  int missing = 0;
  for (size_t a = 0; a < kFactors.size(); ++a) {
    for (size_t b = a + 1; b < kFactors.size(); ++b) {
      for (const auto& va : factors.at(kFactors[a])) {
        for (const auto& vb : factors.at(kFactors[b])) {
          const Pair pair{{kFactors[a], va}, {kFactors[b], vb}};
          const bool build_dependent = va == "16-mixed" || vb == "16-mixed" || va == "bf16" || vb == "bf16";
          const bool covered =
              refused.count(pair) || (build_dependent ? trained.count(pair) : trained_on_every_build.count(pair));
          if (!covered) ++missing;
          EXPECT_TRUE(covered) << kFactors[a] << " " << va << " with " << kFactors[b] << " " << vb
                               << " is covered by no cell";
        }
      }
    }
  }
  std::printf("%zu cells cover every pair of values (%d missing)\n", cells.size(), missing);
}

// The review's reproduction of the replicas drifting apart from the second epoch under --uneven: 52 samples on 3
// ranks with batch 8 give the ranks 3, 2 and 2 batches, so ranks 1 and 2 shadow one step of every epoch.
TEST(InteractionMatrix, UnevenRanksKeepEqualReplicasAndOptimizerStateThroughThreeEpochs) {
  const std::string data = write_tiny_mnist("matrix_uneven_data", 52, 12);
  const std::string cwd = make_temp_dir("matrix_uneven");
  const ProcessResult result =
      run_cell(cwd, {{"--nproc-per-node", "3"},
                     {"--data", data, "--epochs", "3", "--batch-size", "8", "--threads", "1", "--uneven",
                      "--check-replicas-every", "1", "--timeout", "60", "--no-tensorboard", "--no-report"}});
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[epoch 2]"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::testing
