// tandem train as an elastic job across three hosts (network namespaces on one bridge, root only): one host is
// killed mid-epoch (or its link is cut), the other two go on at world size 2 from the newest checkpoint in the
// shared run dir; the host comes back and the job goes on at world size 3, and finishes with the accuracy of an
// uninterrupted run, within noise. Every host runs in the same working directory, so runs/<rdzv-id> is the storage every node sees.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "support/network_namespaces.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::BackgroundProcess;
using testing::NetworkNamespaces;
using testing::ProcessResult;
using testing::ScratchDir;

constexpr int kTrainTimeoutSeconds = 10;
// A whole job (rendezvous, eight short epochs, the changes) and one change: a lost node is noticed after 1 s,
// its peers' collectives end within --timeout, and the new round needs a last call and a start.
constexpr auto kTrainingJobDeadline = 120s;
constexpr auto kTrainingChangeDeadline = std::chrono::seconds(kTrainTimeoutSeconds) + 20s;

class TrainingJob {
 public:
  TrainingJob(const NetworkNamespaces& hosts, const std::string& data, const std::string& id)
      : hosts_(hosts), data_(data), id_(id) {}

  // `launch_flags` and `train_flags` go after tandem run's and tandem train's own. Each worker process appends
  // its pid and host to pids.<RANK> in the shared folder first, so that a test sees which ranks were started
  // again, and where.
  void start(int host, const std::string& launch_flags = "", const std::string& train_flags = "--epochs 8") {
    const std::string logs = dir_ / ("logs" + std::to_string(host));
    // The working directory is the shared storage: every host's runs/<id> is the same folder.
    std::string command = "cd '" + dir_.path() + "' && exec '" + testing::tandem_cli() +
                          "' run --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint " +
                          hosts_.address(0) + ":29400 --rdzv-id " + id_ +
                          " --rdzv-conf keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,"
                          "join_timeout=30 --max-restarts 3 --grace-period 2 --log-dir '" + logs + "' " +
                          launch_flags + " -- sh -c 'echo $$ $TEST_HOST >> pids.$RANK && exec \"$0\" \"$@\"' '" +
                          testing::tandem_cli() + "' train --data '" + data_ +
                          "' --batch-size 16 --threads 1 --seed 5 --checkpoint-every 4 --timeout " +
                          std::to_string(kTrainTimeoutSeconds) + " " + train_flags;
    agents_[host] = std::make_unique<BackgroundProcess>(
        hosts_.on_host(host, {"sh", "-c", command}), std::map<std::string, std::string>{{"TEST_HOST", std::to_string(host)}});
  }
  // The host whose worker started first as rank `rank` ("PID HOST" in pids.<RANK>), or -1.
  int host_of(int rank) const {
    const std::vector<std::string> lines = testing::read_lines(dir_ / ("pids." + std::to_string(rank)));
    if (lines.empty()) return -1;
    return std::stoi(lines.front().substr(lines.front().find(' ') + 1));
  }
  // How many worker processes rank `rank` had, across rounds and replacements.
  size_t processes_of(int rank) const {
    return testing::read_lines(dir_ / ("pids." + std::to_string(rank))).size();
  }
  std::string run_dir() const { return dir_ / ("runs/" + id_); }
  void kill(int host) { ::kill(-agents_[host]->pid(), SIGKILL); }
  // Ends every agent still running; returns what each printed, for a failure's message.
  std::string stop_all() { return testing::kill_all_and_collect(agents_, kTrainingJobDeadline); }
  ProcessResult finish(int host) {
    ProcessResult result = agents_[host]->finish(kTrainingJobDeadline);
    agents_[host].reset();
    return result;
  }

  // Everything the workers wrote, across hosts, rounds and ranks.
  std::string logs() const {
    std::string text;
    for (int host = 0; host < 3; ++host) {
      const std::string folder = dir_ / ("logs" + std::to_string(host));
      if (!std::filesystem::exists(folder)) continue;
      for (const auto& entry : std::filesystem::directory_iterator(folder)) text += testing::read_file(entry.path());
    }
    return text;
  }
  // The finished checkpoints in the shared run dir (temp files carry a ".tmp." suffix and are left out).
  std::set<std::string> checkpoints() const {
    std::set<std::string> names;
    const std::filesystem::path run_dir = dir_ / ("runs/" + id_);
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(run_dir, ignored)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("checkpoint-", 0) == 0 && name.find(".tmp.") == std::string::npos) names.insert(name);
    }
    return names;
  }
  // Waits until a checkpoint not in `known` is in the run dir: the round under way has saved its own progress, so
  // the next round resumes from what this world size wrote. False at the deadline.
  bool wait_for_checkpoint_beyond(const std::set<std::string>& known, std::chrono::seconds deadline) const {
    const auto give_up = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      for (const std::string& name : checkpoints())
        if (!known.count(name)) return true;
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(50ms);
    }
  }
  // Waits until the workers have written a match of `pattern`; false at the deadline.
  bool wait_for(const std::regex& pattern, std::chrono::seconds deadline) const {
    const auto give_up = std::chrono::steady_clock::now() + deadline;
    while (!std::regex_search(logs(), pattern)) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  }

 private:
  const NetworkNamespaces& hosts_;
  std::string data_;
  std::string id_;
  ScratchDir dir_;
  std::map<int, std::unique_ptr<BackgroundProcess>> agents_;
};

// The accuracy of the newest epoch's "[epoch E] loss L accuracy A" line in `output`; -1 if there is none.
double newest_accuracy(const std::string& output) {
  const std::regex pattern("\\[epoch (\\d+)\\] loss [0-9.]+ accuracy ([0-9.]+)");
  int newest = -1;
  double accuracy = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern); it != std::sregex_iterator(); ++it) {
    if (std::stoi((*it)[1]) < newest) continue;
    newest = std::stoi((*it)[1]);
    accuracy = std::stod((*it)[2]);
  }
  return accuracy;
}

TEST(ElasticTraining, AHostCutOffLeavesTwoToContinueWithinTheTimeoutAndRejoinsWhenItsLinkIsBack) {
  NetworkNamespaces hosts(3);
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  const std::string data = testing::write_tiny_mnist("elastic_cut_data", 480, 96);
  TrainingJob job(hosts, data, "cut");
  for (int host = 0; host < 3; ++host) job.start(host);
  ASSERT_TRUE(job.wait_for(std::regex("\\[epoch 2\\] batch [3-9]/"), std::chrono::seconds(90)))
      << "no third epoch under way:\n" << job.logs();
  std::string error;
  ASSERT_TRUE(hosts.take_link_down(2, error)) << error;
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.wait_for(std::regex("continues on 2 ranks x batch 16 where it stopped on 3"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the two left did not continue from a checkpoint:\n" << job.logs();
  std::cout << "two hosts resumed " << std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count()
            << " s after the third's link was cut (--timeout " << kTrainTimeoutSeconds << ")\n";

  // The two-rank round must save before the third host is back, or the next round resumes from the three-rank
  // checkpoint and the change to check (2 -> 3) never shows.
  ASSERT_TRUE(job.wait_for_checkpoint_beyond(job.checkpoints(), std::chrono::seconds(30)))
      << "the two left saved no checkpoint:\n" << job.logs();
  ASSERT_TRUE(hosts.bring_link_up(2, error)) << error;
  ASSERT_TRUE(job.wait_for(std::regex("continues on 3 ranks x batch 16 where it stopped on 2"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the host cut off was not taken in again:\n" << job.logs();
  std::vector<ProcessResult> results;
  for (int host = 0; host < 3; ++host) results.push_back(job.finish(host));
  for (int host = 0; host < 3; ++host) {
    EXPECT_FALSE(results[host].timed_out) << "host " << host << ":\n" << results[host].output;
    EXPECT_EQ(results[host].exit_code, 0) << "host " << host << ":\n" << results[host].output;
  }
  EXPECT_NE(results[2].output.find("lost the job's store"), std::string::npos) << results[2].output;
  EXPECT_GT(newest_accuracy(job.logs()), 0.9) << job.logs();
}

TEST(ElasticTraining, AKilledHostLeavesTwoToContinueFromTheCheckpointAndItsReturnMakesThreeAgain) {
  NetworkNamespaces hosts(3);
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  // 480 images in batches of 16 on three ranks: ten steps an epoch, a checkpoint every four.
  const std::string data = testing::write_tiny_mnist("elastic_training_data", 480, 96);

  TrainingJob whole(hosts, data, "whole");
  for (int host = 0; host < 3; ++host) whole.start(host);
  std::vector<ProcessResult> reference;
  for (int host = 0; host < 3; ++host) reference.push_back(whole.finish(host));
  for (const ProcessResult& result : reference) ASSERT_EQ(result.exit_code, 0) << result.output;
  const double reference_accuracy = newest_accuracy(whole.logs());
  ASSERT_GT(reference_accuracy, 0) << whole.logs();

  TrainingJob job(hosts, data, "changing");
  for (int host = 0; host < 3; ++host) job.start(host);
  ASSERT_TRUE(job.wait_for(std::regex("\\[epoch 2\\] batch [3-9]/"), std::chrono::seconds(90)))
      << "no third epoch under way:\n" << job.logs();
  job.kill(2);
  const auto killed = std::chrono::steady_clock::now();
  job.finish(2);
  ASSERT_TRUE(job.wait_for(std::regex("continues on 2 ranks x batch 16 where it stopped on 3"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the two left did not continue from a checkpoint:\n" << job.logs();
  std::cout << "two hosts resumed " << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count()
            << " s after the third was killed\n";

  ASSERT_TRUE(job.wait_for_checkpoint_beyond(job.checkpoints(), std::chrono::seconds(30)))
      << "the two left saved no checkpoint:\n" << job.logs();
  job.start(2);
  ASSERT_TRUE(job.wait_for(std::regex("continues on 3 ranks x batch 16 where it stopped on 2"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the host that came back was not taken in:\n" << job.logs();

  std::vector<ProcessResult> results;
  for (int host = 0; host < 3; ++host) results.push_back(job.finish(host));
  for (int host = 0; host < 3; ++host) {
    EXPECT_FALSE(results[host].timed_out) << "host " << host << ":\n" << results[host].output;
    EXPECT_EQ(results[host].exit_code, 0) << "host " << host << ":\n" << results[host].output;
  }
  // Either detector may end the three-rank round first: the agents' heartbeat ("node 2 ... was lost") or the
  // workers' collective, whose failure on a surviving node ends it as a failed rank. Whichever it was, the round
  // ended by a failure, once, and the return was a change that cost no restart.
  EXPECT_TRUE(std::regex_search(results[0].output,
                                std::regex("tandem run: (node \\d \\(10\\.77\\.0\\.3, pid \\d+\\) was lost: no heartbeat for [0-9.]+ s|"
                                           "rank \\d exited with code \\d+ on node \\d \\(10\\.77\\.0\\.[12], pid \\d+\\)); "
                                           "restarting the workers of every node in a new round \\(restart 1 of 3\\)")))
      << results[0].output;
  EXPECT_EQ(results[0].output.find("(restart 2 of 3)"), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("a node joining is no restart"), std::string::npos) << results[0].output;
  const double accuracy = newest_accuracy(job.logs());
  std::cout << "final accuracy " << accuracy << ", uninterrupted " << reference_accuracy << "\n";
  EXPECT_NEAR(accuracy, reference_accuracy, 0.1) << job.logs();
}

// Under --recovery in-job the cut-off host's place is kept: the other two train on in their processes, at world
// size 2 and without a checkpoint read, and the host, once its link is back, takes its place again in the same
// round, its worker healed live from the others.
TEST(ElasticTraining, UnderInJobRecoveryAHostCutOffLeavesTheOthersTrainingAndIsHealedLiveOnItsReturn) {
  NetworkNamespaces hosts(3);
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  // 1,920 images in batches of 16 on three ranks: 40 steps an epoch; ten epochs leave the cut host time to return
  // (its agent waits for the job's store, then --grace-period and a margin before it takes the place).
  const std::string data = testing::write_tiny_mnist("elastic_in_job_data", 1920, 96);
  TrainingJob job(hosts, data, "in-job");
  for (int host = 0; host < 3; ++host) {
    job.start(host, "--recovery in-job", "--epochs 10 --check-replicas-every 1 --no-tensorboard");
  }
  ASSERT_TRUE(job.wait_for(std::regex("\\[epoch 0\\] batch 1[0-9]/"), std::chrono::seconds(90)))
      << "no step under way:\n" << job.logs();
  // Rank 0's host holds the run's records, and its loss restarts the job: cut the host of rank 2.
  const int cut_host = job.host_of(2);
  ASSERT_GT(cut_host, 0) << "the agents came in an order that put rank 2 on host " << cut_host;
  std::string error;
  ASSERT_TRUE(hosts.take_link_down(cut_host, error)) << error;
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.wait_for(std::regex("membership epoch \\d+: slots 0,1 go on as 2 ranks"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the two left did not go on in the job:\n" << job.logs() << job.stop_all();
  std::cout << "two hosts went on " << std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count()
            << " s after the third's link was cut\n";
  ASSERT_TRUE(hosts.bring_link_up(cut_host, error)) << error;
  const auto back = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.wait_for(std::regex("membership epoch \\d+: slots 0,1,2 go on as 3 ranks"),
                           std::chrono::duration_cast<std::chrono::seconds>(kTrainingChangeDeadline)))
      << "the host cut off was not taken in again:\n" << job.logs() << job.stop_all();
  std::cout << "three ranks again " << std::chrono::duration<double>(std::chrono::steady_clock::now() - back).count()
            << " s after the link was back\n";

  std::vector<ProcessResult> results;
  for (int host = 0; host < 3; ++host) results.push_back(job.finish(host));
  for (int host = 0; host < 3; ++host) {
    EXPECT_FALSE(results[host].timed_out) << "host " << host << ":\n" << results[host].output;
    // --check-replicas-every 1 compares the replicas at every step: a divergence ends the run non-zero.
    EXPECT_EQ(results[host].exit_code, 0) << "host " << host << ":\n" << results[host].output;
  }
  EXPECT_NE(results[cut_host].output.find("in a lost node's place (in-job recovery)"), std::string::npos)
      << results[cut_host].output;
  EXPECT_EQ(results[0].output.find("restarting the workers"), std::string::npos) << results[0].output;
  EXPECT_EQ(job.logs().find("resuming from"), std::string::npos) << "no checkpoint may be read:\n" << job.logs();
  EXPECT_EQ(job.processes_of(0), 1u) << "the survivors keep their processes";
  EXPECT_EQ(job.processes_of(1), 1u);
  EXPECT_EQ(job.processes_of(2), 2u) << "the cut host's worker, and the one it started on its return";

  std::vector<int> worlds;
  int64_t step = 0;
  for (const std::string& line : testing::read_lines(job.run_dir() + "/steps.jsonl")) {
    const nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_EQ(record["step"].get<int64_t>(), ++step) << "each step once, none trained again";
    const int world = record["world_size"].get<int>();
    if (worlds.empty() || worlds.back() != world) worlds.push_back(world);
  }
  EXPECT_EQ(worlds, (std::vector<int>{3, 2, 3})) << results[0].output << results[1].output << results[2].output
                                                 << job.logs();
}

}  // namespace
}  // namespace tandem
