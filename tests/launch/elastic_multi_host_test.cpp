// Elastic jobs across hosts (`tandem run --nnodes 2:3 --rdzv-backend c10d`): three hosts as network namespaces on
// one bridge (support/network_namespaces.h; root only, skipped elsewhere), one agent each, host 0's serving the
// store. The workers here are small shell scripts that record each round they run in (round, rank, world size)
// and wait for the test's word to finish, so these tests check the agents alone: a host lost by SIGKILL or by a
// cut link, the survivors' new round, the host coming back, the job finishing. tandem train across such changes
// is elastic_training_test.cpp's.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "support/network_namespaces.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::BackgroundProcess;
using testing::NetworkNamespaces;
using testing::ProcessResult;
using testing::ScratchDir;

// Heartbeats every 0.5 s, a node lost after 1 s without; a round below its most nodes closes after 1 s.
const std::string kRendezvousConf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=20";
// How long one change (a lost or returning node, a new round, workers stopped and started) may take: the
// heartbeat loss, the grace period, the last call, with room for a loaded machine.
constexpr auto kChangeDeadline = 30s;
constexpr auto kExitDeadline = 30s;

struct Round {
  int round = 0;
  int rank = 0;
  int world = 0;
  int host = 0;
};

// Every line the workers appended to `events`: "round R rank K world W host H".
std::vector<Round> read_rounds(const std::string& events) {
  std::vector<Round> rounds;
  std::ifstream in(events);
  std::string line;
  const std::regex pattern("round (\\d+) rank (\\d+) world (\\d+) host (\\d+)");
  std::smatch match;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, match, pattern)) continue;
    rounds.push_back({std::stoi(match[1]), std::stoi(match[2]), std::stoi(match[3]), std::stoi(match[4])});
  }
  return rounds;
}

// The newest round in which `world` workers have all started, or -1.
int started_round(const std::string& events, int world, int after = -1) {
  std::map<int, std::set<int>> ranks;
  for (const Round& round : read_rounds(events)) {
    if (round.world == world && round.round > after) ranks[round.round].insert(round.rank);
  }
  int newest = -1;
  for (const auto& [number, seen] : ranks) {
    if (static_cast<int>(seen.size()) == world) newest = number;
  }
  return newest;
}

// The indices of the lines of `file` that start with `start`.
std::vector<int> lines_of(const std::string& file, const std::string& start) {
  std::ifstream in(file);
  std::vector<int> found;
  int index = 0;
  for (std::string line; std::getline(in, line); ++index) {
    if (line.rfind(start, 0) == 0) found.push_back(index);
  }
  return found;
}

class ElasticJob {
 public:
  ElasticJob() : hosts_(3) {}

  bool usable() const { return hosts_.usable(); }
  const std::string& unusable_reason() const { return hosts_.unusable_reason(); }
  const NetworkNamespaces& hosts() const { return hosts_; }
  std::string events() const { return dir_ / "events"; }

  void start(int host) { start(host, kRendezvousConf); }
  // The agent's own output goes to agent_output(host), where the test can read it while the agent runs.
  void start(int host, const std::string& conf, bool output_to_file = false) {
    // The same command on every host (the job's agents insist); the host comes through the environment. Host
    // 2's workers ignore SIGTERM, so they go only at SIGKILL after the grace period, while the others stop at
    // once; every worker says it is alive every 0.1 s: the events show which still ran when a round started.
    const std::string worker = "[ \"$TEST_HOST\" = 2 ] && trap '' TERM; echo \"round $TORCHELASTIC_RESTART_COUNT rank $RANK world $WORLD_SIZE "
                               "host $TEST_HOST\" >> '" + events() + "'; while [ ! -e '" + (dir_ / "finish") +
                               "' ]; do echo \"alive round $TORCHELASTIC_RESTART_COUNT host $TEST_HOST\" >> '" +
                               events() + "'; sleep 0.1; done";
    std::vector<std::string> agent{testing::tandem_cli(), "run", "--nnodes", "2:3", "--nproc-per-node", "1",
                                   "--rdzv-backend", "c10d", "--rdzv-endpoint", hosts_.address(0) + ":29400",
                                   "--rdzv-id", "elastic-test", "--rdzv-conf", conf, "--max-restarts", "3",
                                   "--grace-period", "1", "--", "sh", "-c", worker};
    if (output_to_file) {
      agent.insert(agent.begin(), {"sh", "-c", "exec \"$@\" > '" + agent_output(host) + "' 2>&1", "sh"});
    }
    agents_[host] = std::make_unique<BackgroundProcess>(
        hosts_.on_host(host, agent), std::map<std::string, std::string>{{"TEST_HOST", std::to_string(host)}});
  }
  std::string agent_output(int host) const { return dir_ / ("agent" + std::to_string(host)); }
  // Waits until the agent started with its output to a file has printed `text`; false at kChangeDeadline.
  bool wait_for_agent_line(int host, const std::string& text) const {
    const auto give_up = std::chrono::steady_clock::now() + kChangeDeadline;
    while (testing::read_file(agent_output(host)).find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }
  void interrupt(int host) { ::kill(-agents_[host]->pid(), SIGINT); }
  void kill(int host) { ::kill(-agents_[host]->pid(), SIGKILL); }
  ProcessResult finish(int host) {
    if (!agents_[host]) return {};
    ProcessResult result = agents_[host]->finish(kExitDeadline);
    agents_[host].reset();
    return result;
  }
  void let_workers_finish() { std::ofstream(dir_ / "finish") << "done\n"; }

  // Ends every agent still running; returns what each printed, for a failure's message.
  std::string stop_all() { return testing::kill_all_and_collect(agents_, kExitDeadline); }

  // Waits until every one of `world` workers has started in a round after `after`; returns that round.
  int wait_for_round(int world, int after, const std::string& what) {
    const auto give_up = std::chrono::steady_clock::now() + kChangeDeadline;
    int round = -1;
    while ((round = started_round(events(), world, after)) < 0) {
      if (std::chrono::steady_clock::now() >= give_up) {
        ADD_FAILURE() << what << ": no round of world size " << world << " after round " << after << " within "
                      << kChangeDeadline.count() << " s; rounds so far:\n"
                      << testing::read_file(events()) << "agents:\n"
                      << stop_all();
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return round;
  }

 private:
  NetworkNamespaces hosts_;
  ScratchDir dir_;
  std::map<int, std::unique_ptr<BackgroundProcess>> agents_;
};

TEST(ElasticMultiHost, ALostHostLeavesTheOthersToGoOnAndABackHostJoinsAgain) {
  ElasticJob job;
  if (!job.usable()) GTEST_SKIP() << job.unusable_reason();
  for (int host = 0; host < 3; ++host) job.start(host);
  const int first = job.wait_for_round(3, -1, "three hosts starting");
  ASSERT_GE(first, 0);

  job.kill(2);
  const int without = job.wait_for_round(2, first, "host 2 killed with SIGKILL");
  ASSERT_GT(without, first);
  job.finish(2);

  job.start(2);
  const int back = job.wait_for_round(3, without, "host 2 started again");
  ASSERT_GT(back, without);

  job.let_workers_finish();
  for (int host = 0; host < 3; ++host) {
    const ProcessResult result = job.finish(host);
    EXPECT_FALSE(result.timed_out) << "host " << host << ":\n" << result.output;
    EXPECT_EQ(result.exit_code, 0) << "host " << host << ":\n" << result.output;
    if (host == 2) continue;
    EXPECT_TRUE(std::regex_search(result.output, std::regex("tandem run: node [12] \\(10\\.77\\.0\\.3, pid \\d+\\) was "
                                                            "lost: no heartbeat for 1\\.0 s; restarting")))
        << result.output;
    EXPECT_NE(result.output.find("a node is waiting to join the 2 running; forming a new round with it (a node "
                                 "joining is no restart)"),
              std::string::npos)
        << result.output;
  }
}

TEST(ElasticMultiHost, AHostCutOffRejoinsOnceItsLinkIsBack) {
  ElasticJob job;
  if (!job.usable()) GTEST_SKIP() << job.unusable_reason();
  for (int host = 0; host < 3; ++host) job.start(host);
  const int first = job.wait_for_round(3, -1, "three hosts starting");
  ASSERT_GE(first, 0);

  std::string error;
  ASSERT_TRUE(job.hosts().take_link_down(2, error)) << error;
  const int without = job.wait_for_round(2, first, "host 2's link cut");
  ASSERT_GT(without, first);
  // The order that keeps a cut-off node from training (or pruning checkpoints) beside the next round: its
  // workers were gone before the others started their next round (docs/launcher.md, "A cut link").
  const std::vector<int> cut_off_alive = lines_of(job.events(), "alive round " + std::to_string(first) + " host 2");
  const std::vector<int> next_started = lines_of(job.events(), "round " + std::to_string(without) + " rank");
  ASSERT_FALSE(cut_off_alive.empty() || next_started.empty()) << testing::read_file(job.events());
  EXPECT_LT(cut_off_alive.back(), next_started.front())
      << "host 2's worker still ran when round " << without << " started:\n" << testing::read_file(job.events());

  ASSERT_TRUE(job.hosts().bring_link_up(2, error)) << error;
  const int back = job.wait_for_round(3, without, "host 2's link back");
  ASSERT_GT(back, without);

  job.let_workers_finish();
  for (int host = 0; host < 3; ++host) {
    const ProcessResult result = job.finish(host);
    EXPECT_FALSE(result.timed_out) << "host " << host << ":\n" << result.output;
    EXPECT_EQ(result.exit_code, 0) << "host " << host << ":\n" << result.output;
    if (host == 2) {
      EXPECT_NE(result.output.find("tandem run: lost the job's store at 10.77.0.1:29400"), std::string::npos)
          << result.output;
    }
  }
}

TEST(ElasticMultiHost, LosingTheStoreHostEndsEveryOtherNodeWithOneLineAfterTheJoinTimeout) {
  ElasticJob job;
  if (!job.usable()) GTEST_SKIP() << job.unusable_reason();
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=3";
  for (int host = 0; host < 3; ++host) job.start(host, conf);
  ASSERT_GE(job.wait_for_round(3, -1, "three hosts starting"), 0);
  job.kill(0);
  job.finish(0);
  for (int host = 1; host < 3; ++host) {
    const ProcessResult result = job.finish(host);
    EXPECT_FALSE(result.timed_out) << "host " << host << ":\n" << result.output;
    EXPECT_EQ(result.exit_code, 1) << "host " << host << ":\n" << result.output;
    EXPECT_NE(result.output.find("tandem run: lost the job's store at 10.77.0.1:29400"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("tandem: error: cannot reach the elastic job's store at 10.77.0.1:29400 within "
                                 "join_timeout 3 s"),
              std::string::npos)
        << result.output;
  }
}

TEST(ElasticMultiHost, CtrlCWhileRejoiningEndsTheAgentWithoutWaitingForTheJoinTimeout) {
  ElasticJob job;
  if (!job.usable()) GTEST_SKIP() << job.unusable_reason();
  // A join_timeout far beyond the test's exit deadline: an agent that waited it out would be killed as hung.
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=300";
  for (int host = 0; host < 3; ++host) job.start(host, conf, /*output_to_file=*/host == 1);
  ASSERT_GE(job.wait_for_round(3, -1, "three hosts starting"), 0);
  job.kill(0);
  job.finish(0);
  ASSERT_TRUE(job.wait_for_agent_line(1, "trying to rejoin")) << testing::read_file(job.agent_output(1))
                                                              << job.stop_all();
  job.interrupt(1);
  const ProcessResult result = job.finish(1);
  const std::string output = testing::read_file(job.agent_output(1));
  EXPECT_FALSE(result.timed_out) << output;
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << output;
  EXPECT_NE(output.find("received SIGINT while trying to rejoin"), std::string::npos) << output;
  job.stop_all();
}

TEST(ElasticMultiHost, AnEndpointWithoutARouteIsOneLineWithinTheJoinTimeout) {
  NetworkNamespaces hosts(1);
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  const auto started = std::chrono::steady_clock::now();
  const ProcessResult result = testing::run_process(
      hosts.on_host(0, {testing::tandem_cli(), "run", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        "10.78.0.1:29400", "--rdzv-id", "no-route", "--rdzv-conf", "join_timeout=2", "--", "true"}),
      {}, kExitDeadline);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("tandem: error: cannot reach the elastic job's store at 10.78.0.1:29400 within "
                               "join_timeout 2 s"),
            std::string::npos)
      << result.output;
  std::cout << "gave up after " << took << " s (join_timeout 2 s)\n";
}

}  // namespace
}  // namespace tandem
