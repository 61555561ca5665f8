// Every rank must see rank 0's run dir (issue 31, item 8): checkpoints are written by rank 0 and read by all, so
// a run dir local to each node would leave the other nodes' ranks without the checkpoint rank 0 continues from.
// Two real `tandem train` processes in different working folders, given the same relative --run-dir, stand for
// two nodes that do not share it: the rank that cannot read rank 0's marker says so in one line, and both exit
// non-zero before training, within the deadline.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"

// A namespace of its own: the tests of a folder are compiled as one unit.
namespace tandem::train::shared_run_dir {
namespace {

using testing::make_temp_dir;

// `tandem train ARGS` as rank r of `world` in working folder cwds[r].
std::vector<testing::ProcessResult> run_ranks_in(const std::vector<std::string>& cwds, const std::vector<std::string>& args) {
  const int world = static_cast<int>(cwds.size());
  const std::string port = std::to_string(testing::free_port());
  std::string command = "exec '" + testing::tandem_cli() + "' train";
  for (const std::string& arg : args) command += " '" + arg + "'";
  std::vector<std::future<testing::ProcessResult>> running;
  for (int r = 0; r < world; ++r) {
    const std::map<std::string, std::string> env = {
        {"RANK", std::to_string(r)},          {"LOCAL_RANK", "0"},         {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_WORLD_SIZE", "1"},            {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
    const std::vector<std::string> argv = {"sh", "-c", "cd '" + cwds[r] + "' && " + command};
    running.push_back(std::async(std::launch::async, [argv, env] {
      return testing::run_process(argv, env, std::chrono::seconds(90));
    }));
  }
  std::vector<testing::ProcessResult> results;
  for (auto& f : running) results.push_back(f.get());
  return results;
}

std::vector<std::string> train_args(const std::string& data) {
  return {"--data", data, "--run-dir", "shared-run", "--epochs", "1", "--batch-size", "8", "--threads", "1",
          "--timeout", "30", "--no-tensorboard", "--no-report"};
}

TEST(SharedRunDir, ARankThatDoesNotSeeRankZerosRunDirStopsTheRunWithOneLine) {
  const std::string data = testing::write_tiny_mnist("shared_run_dir_data", 48, 8);
  const std::string node0 = make_temp_dir("shared_run_dir_node0"), node1 = make_temp_dir("shared_run_dir_node1");
  const auto results = run_ranks_in({node0, node1}, train_args(data));
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_NE(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_EQ(results[r].output.find("[epoch 0]"), std::string::npos) << "nothing is trained:\n" << results[r].output;
  }
  const std::string& line = results[1].output;
  EXPECT_NE(line.find("rank 1 on " + std::string(host)), std::string::npos) << line;
  EXPECT_NE(line.find("run dir shared-run (" + node1 + "/shared-run)"), std::string::npos) << line;
  EXPECT_NE(line.find("put --run-dir on storage every node mounts"), std::string::npos) << line;
  EXPECT_TRUE(std::filesystem::exists(node0 + "/shared-run/.tandem-run-marker"));
  EXPECT_FALSE(std::filesystem::exists(node1 + "/shared-run/.tandem-run-marker"));
}

// The same run dir seen by both ranks: the check passes and the run trains, and a second start continuing it
// writes a fresh marker that both ranks read again, with the checkpoint rank 0 chose.
TEST(SharedRunDir, RanksThatShareTheRunDirTrainAndContinue) {
  const std::string data = testing::write_tiny_mnist("shared_run_dir_ok_data", 48, 8);
  const std::string node = make_temp_dir("shared_run_dir_shared");
  std::vector<std::string> stopped = train_args(data);
  stopped.insert(stopped.end(), {"--steps", "2"});
  std::string first_marker;
  for (const auto& args : {stopped, train_args(data)}) {
    const auto results = run_ranks_in({node, node}, args);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    }
    std::ifstream marker(node + "/shared-run/.tandem-run-marker");
    std::string nonce;
    ASSERT_TRUE(std::getline(marker, nonce));
    EXPECT_NE(nonce, first_marker) << "each start writes a fresh marker";
    if (first_marker.empty()) {
      first_marker = nonce;
    } else {
      EXPECT_NE(results[0].output.find("resuming from"), std::string::npos) << results[0].output;
    }
  }
}

}  // namespace
}  // namespace tandem::train::shared_run_dir
