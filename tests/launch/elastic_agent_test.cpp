// Elastic agents on one machine (`tandem run --rdzv-backend c10d` on 127.0.0.1, no root needed): the first
// agent serves the store, the second finds the port taken and joins it. What the agents do together: a worker
// failing on one node restarts every node's workers in a new round, until --max-restarts is used up; a second
// job under the same id is refused; an endpoint that never answers ends in one line within join_timeout.
// Losing hosts and links is elastic_multi_host_test.cpp's.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <regex>

#include "support/listening_sockets.h"
#include "support/processes.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::ProcessResult;

constexpr auto kAgentDeadline = 60s;
const std::string kAgentConf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=10";

std::vector<std::string> agent_argv(int port, const std::string& id, const std::vector<std::string>& flags,
                               const std::string& worker) {
  std::vector<std::string> argv{testing::tandem_cli(), "run", "--nnodes", "2", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--rdzv-id", id,
                                "--rdzv-conf", kAgentConf, "--grace-period", "1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"--", "sh", "-c", worker});
  return argv;
}

// Two agents of one job side by side; their results in the order started.
std::vector<ProcessResult> run_two(const std::vector<std::string>& first, const std::vector<std::string>& second) {
  auto a = std::async(std::launch::async, [&] { return testing::run_process(first, {}, kAgentDeadline); });
  auto b = std::async(std::launch::async, [&] { return testing::run_process(second, {}, kAgentDeadline); });
  return {a.get(), b.get()};
}

TEST(ElasticAgent, AWorkerFailingOnOneNodeRestartsEveryNodeInANewRound) {
  const int port = testing::free_port();
  // Rank 1 fails in round 0 only; every worker of round 1 succeeds.
  const std::string worker = "echo \"round $TORCHELASTIC_RESTART_COUNT rank $RANK of $WORLD_SIZE\"; "
                             "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ] && exit 3; exit 0";
  const auto results = run_two(agent_argv(port, "fails-once", {"--max-restarts", "1"}, worker),
                               agent_argv(port, "fails-once", {"--max-restarts", "1"}, worker));
  for (const ProcessResult& result : results) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_TRUE(std::regex_search(result.output, std::regex("tandem run: rank 1 exited with code 3 on node 1 "
                                                            "\\(127\\.0\\.0\\.1, pid \\d+\\); restarting the workers "
                                                            "of every node in a new round \\(restart 1 of 1\\)")))
        << result.output;
    EXPECT_NE(result.output.find("round 1 rank"), std::string::npos) << result.output;
  }
}

TEST(ElasticAgent, OutOfRestartsEveryNodeStopsWithTheFailure) {
  const int port = testing::free_port();
  const std::string worker = "[ $RANK = 1 ] && exit 3; sleep 30";
  const auto results = run_two(agent_argv(port, "fails-always", {}, worker), agent_argv(port, "fails-always", {}, worker));
  int failed_node = 0;
  for (const ProcessResult& result : results) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.output.find("rank 1 exited with code 3 on node 1"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("(no restart allowed)"), std::string::npos) << result.output;
    // The node of rank 1 exits with its code, the other with 1.
    EXPECT_TRUE(result.exit_code == 3 || result.exit_code == 1) << result.output;
    failed_node += result.exit_code == 3 ? 1 : 0;
  }
  EXPECT_EQ(failed_node, 1);
}

TEST(ElasticAgent, ASecondJobUnderTheSameIdIsRefusedInOneLine) {
  const int port = testing::free_port();
  const auto results = run_two(agent_argv(port, "one-id", {"--nproc-per-node", "1"}, "exit 0"),
                               agent_argv(port, "one-id", {"--nproc-per-node", "2"}, "exit 0"));
  // Whichever came second is refused; the first then waits in vain for a second node, until join_timeout.
  const bool second_refused = results[1].exit_code == 2;
  const ProcessResult& refused = results[second_refused ? 1 : 0];
  EXPECT_EQ(refused.exit_code, 2) << results[0].output << results[1].output;
  EXPECT_TRUE(std::regex_search(refused.output, std::regex("tandem: error: this node's --nproc-per-node is [12], but "
                                                           "the job's other nodes run [12]")))
      << refused.output;
  EXPECT_EQ(results[second_refused ? 0 : 1].exit_code, 1) << results[second_refused ? 0 : 1].output;
}

TEST(ElasticAgent, AnEndpointThatNeverAnswersIsOneLineWithinTheJoinTimeout) {
  // Listening, so connections are accepted by the kernel, but nobody ever answers a store request.
  testing::HeldPort silent;
  const auto started = std::chrono::steady_clock::now();
  const ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "run", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
       "127.0.0.1:" + std::to_string(silent.port()), "--rdzv-id", "silent", "--rdzv-conf", "join_timeout=2", "--",
       "true"},
      {}, kAgentDeadline);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("tandem: error: cannot reach the elastic job's store at 127.0.0.1:" +
                               std::to_string(silent.port()) + " within join_timeout 2 s"),
            std::string::npos)
      << result.output;
  std::cout << "gave up after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s (join_timeout 2 s)\n";
}

}  // namespace
}  // namespace tandem
