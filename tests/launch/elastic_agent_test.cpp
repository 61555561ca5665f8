// Elastic agents on one machine (`tandem run --rdzv-backend c10d` on 127.0.0.1, no root needed): the first
// agent serves the store, the second finds the port taken and joins it. What the agents do together: a worker
// failing on one node restarts every node's workers in a new round, until --max-restarts is used up; agents that
// disagree on the job are refused; an agent that leaves while it waits to join leaves the job running, and one
// that waits while the job finishes ends with it; an endpoint that is no store ends in one line within
// join_timeout, and a Ctrl-C while the agent waits for the store, in one line and 130. Losing hosts and links is
// elastic_multi_host_test.cpp's.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <regex>
#include <thread>

#include "support/listening_sockets.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::ProcessResult;

constexpr auto kAgentDeadline = 60s;
const std::string kAgentConf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=10";

std::vector<std::string> agent_argv(int port, const std::string& id, const std::vector<std::string>& flags,
                                    const std::string& worker, const std::string& nnodes = "2",
                                    const std::string& conf = kAgentConf, const std::string& grace_period = "1") {
  std::vector<std::string> argv{testing::tandem_cli(), "run", "--nnodes", nnodes, "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--rdzv-id", id,
                                "--rdzv-conf", conf, "--grace-period", grace_period};
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

// Two agents that disagree on one thing the job's agents must share: whichever came second is refused in one
// line naming both values; the first then waits in vain for a second node, until join_timeout.
struct Disagreement {
  std::string what;
  std::vector<std::string> first_flags, second_flags;
  std::string first_nnodes, second_nnodes;
  std::string first_worker, second_worker;
  std::string refusal;  // a regex of the refused agent's line
};

TEST(ElasticAgent, AgentsThatDisagreeOnTheJobAreRefusedInOneLine) {
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=3";
  const std::vector<Disagreement> cases{
      {"--nproc-per-node", {"--nproc-per-node", "1"}, {"--nproc-per-node", "2"}, "2", "2", "exit 0", "exit 0",
       "this node's --nproc-per-node is [12], but the job's other nodes have [12]"},
      {"--nnodes", {}, {}, "2", "2:3", "exit 0", "exit 0",
       "this node's --nnodes is 2:[23], but the job's other nodes have 2:[23]"},
      {"--max-restarts", {"--max-restarts", "0"}, {"--max-restarts", "1"}, "2", "2", "exit 0", "exit 0",
       "this node's --max-restarts is [01], but the job's other nodes have [01]"},
      {"the command", {}, {}, "2", "2", "exit 0", "exit 1",
       "this node's command is sh -c exit [01], but the job's other nodes have sh -c exit [01]"},
  };
  for (const Disagreement& two : cases) {
    const int port = testing::free_port();
    const auto results = run_two(agent_argv(port, "one-id", two.first_flags, two.first_worker, two.first_nnodes, conf),
                                 agent_argv(port, "one-id", two.second_flags, two.second_worker, two.second_nnodes, conf));
    const bool second_refused = results[1].exit_code == 2;
    const ProcessResult& refused = results[second_refused ? 1 : 0];
    EXPECT_EQ(refused.exit_code, 2) << two.what << ":\n" << results[0].output << results[1].output;
    EXPECT_TRUE(std::regex_search(refused.output, std::regex("tandem: error: " + two.refusal)))
        << two.what << ":\n" << refused.output;
    EXPECT_EQ(results[second_refused ? 0 : 1].exit_code, 1) << two.what << ":\n" << results[second_refused ? 0 : 1].output;
  }
}

// A job of two running agents whose workers wait for the test's word, and a third agent started beside them
// with its output in a file the test reads while it runs.
class JobWithANewcomer {
 public:
  JobWithANewcomer(const std::string& id, const std::string& nnodes, const std::vector<std::string>& flags)
      : port_(testing::free_port()) {
    // The workers ignore SIGTERM: a round that ends takes the whole --grace-period to stop them, so a newcomer
    // waits that long at least before a round can take it in.
    const std::string worker = "trap '' TERM; echo \"round $TORCHELASTIC_RESTART_COUNT rank $RANK\" >> '" +
                               (dir_ / "events") + "'; while [ ! -e '" + (dir_ / "finish") + "' ]; do sleep 0.05; done";
    argv_ = agent_argv(port_, id, flags, worker, nnodes, kAgentConf, "3");
    for (int i = 0; i < 2; ++i) running_.push_back(std::async(std::launch::async, [this] {
      return testing::run_process(argv_, {}, kAgentDeadline);
    }));
  }
  ~JobWithANewcomer() { let_workers_finish(); }

  // Once both running agents' workers have started, starts the third agent and waits until it says that it
  // waits to join; false at the deadline.
  bool start_newcomer() {
    const auto give_up = std::chrono::steady_clock::now() + kAgentDeadline / 2;
    while (testing::read_file(dir_ / "events").find("round 0 rank 1") == std::string::npos ||
           testing::read_file(dir_ / "events").find("round 0 rank 0") == std::string::npos) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<std::string> argv{"sh", "-c", "exec \"$@\" > '" + newcomer_output() + "' 2>&1", "sh"};
    argv.insert(argv.end(), argv_.begin(), argv_.end());
    newcomer_ = std::make_unique<testing::BackgroundProcess>(argv);
    while (testing::read_file(newcomer_output()).find("waiting to join") == std::string::npos) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  void interrupt_newcomer() { ::kill(-newcomer_->pid(), SIGINT); }
  void pause_newcomer() { ::kill(-newcomer_->pid(), SIGSTOP); }
  void resume_newcomer() { ::kill(-newcomer_->pid(), SIGCONT); }
  // Waits until one of the running agents has exited; false at the deadline.
  bool one_running_agent_exited() {
    const auto give_up = std::chrono::steady_clock::now() + kAgentDeadline;
    while (std::chrono::steady_clock::now() < give_up) {
      for (auto& agent : running_) {
        if (agent.wait_for(std::chrono::milliseconds(20)) == std::future_status::ready) return true;
      }
    }
    return false;
  }
  void let_workers_finish() { std::ofstream(dir_ / "finish") << "done\n"; }
  std::string newcomer_output() const { return dir_ / "newcomer"; }

  ProcessResult finish_newcomer() { return newcomer_->finish(kAgentDeadline); }
  std::vector<ProcessResult> finish_running() {
    std::vector<ProcessResult> results;
    for (auto& agent : running_) results.push_back(agent.get());
    running_.clear();
    return results;
  }

 private:
  int port_;
  testing::ScratchDir dir_;
  std::vector<std::string> argv_;
  std::vector<std::future<ProcessResult>> running_;
  std::unique_ptr<testing::BackgroundProcess> newcomer_;
};

TEST(ElasticAgent, AnAgentInterruptedWhileWaitingToJoinLeavesTheJobRunning) {
  // No restart allowed: a slot the newcomer kept would become a node that never beats, lost, ending the job.
  JobWithANewcomer job("newcomer-leaves", "2:3", {"--max-restarts", "0"});
  ASSERT_TRUE(job.start_newcomer()) << testing::read_file(job.newcomer_output());
  job.interrupt_newcomer();
  const ProcessResult newcomer = job.finish_newcomer();
  const std::string said = testing::read_file(job.newcomer_output());
  EXPECT_FALSE(newcomer.timed_out) << said;
  EXPECT_EQ(newcomer.exit_code, 128 + SIGINT) << said;
  EXPECT_NE(said.find("received SIGINT while waiting for a round; no worker was running"), std::string::npos) << said;
  job.let_workers_finish();
  for (const ProcessResult& result : job.finish_running()) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
  }
}

TEST(ElasticAgent, AJobThatFinishesWhileANodeWaitsToJoinEndsWithZeroOnEveryAgent) {
  // At its most nodes: the newcomer waits until one goes, and none does. Held still while the job ends, it looks
  // again only after a running agent has gone: the hosting agent must keep the store up until it has read the end.
  JobWithANewcomer job("newcomer-waits", "2", {});
  ASSERT_TRUE(job.start_newcomer()) << testing::read_file(job.newcomer_output());
  job.pause_newcomer();
  job.let_workers_finish();
  EXPECT_TRUE(job.one_running_agent_exited());
  job.resume_newcomer();
  for (const ProcessResult& result : job.finish_running()) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
  }
  const ProcessResult newcomer = job.finish_newcomer();
  const std::string said = testing::read_file(job.newcomer_output());
  EXPECT_FALSE(newcomer.timed_out) << said;
  EXPECT_EQ(newcomer.exit_code, 0) << said;
  EXPECT_NE(said.find("tandem run: the job finished while this node waited to join it"), std::string::npos) << said;
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

// A service that greets, `delay` after it accepted the connection: c10d's client must never read the greeting
// (on LibTorch 1.13 it took it for a length and died of std::bad_alloc, where a 100 ms wait for a greeting had let
// a later one through).
void expect_a_greeting_service_is_one_line(std::chrono::milliseconds delay) {
  testing::GreetingPort ssh("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", delay);
  const ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "run", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
       "127.0.0.1:" + std::to_string(ssh.port()), "--rdzv-id", "greeted", "--rdzv-conf", "join_timeout=2", "--",
       "true"},
      {}, kAgentDeadline);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.term_signal, 0) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  const std::string endpoint = "127.0.0.1:" + std::to_string(ssh.port());
  EXPECT_NE(result.output.find("tandem: error: cannot reach the elastic job's store at " + endpoint +
                               " within join_timeout 2 s (it answered as no c10d store does (\"SSH-2.0-OpenSSH_9.2p1 "
                               "De...\"): another service listens there)"),
            std::string::npos)
      << result.output;
  // Said once what it waits for, not once per try; and no crash dump of c10d's client reading the greeting.
  const std::regex waiting("tandem run: waiting for the elastic job's store at " + endpoint);
  EXPECT_EQ(std::distance(std::sregex_iterator(result.output.begin(), result.output.end(), waiting),
                          std::sregex_iterator()),
            1)
      << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
}

TEST(ElasticAgent, AnEndpointOfAnotherServiceThatSpeaksFirstIsOneLineWithinTheJoinTimeout) {
  expect_a_greeting_service_is_one_line(0ms);
}

TEST(ElasticAgent, AnEndpointOfAnotherServiceThatGreetsHalfASecondLateIsOneLineWithinTheJoinTimeout) {
  expect_a_greeting_service_is_one_line(500ms);
}

// A Ctrl-C while the agent waits for the store ended it by the signal's default death, with no word: it ends as
// one later does, with 128 + the signal and one line.
TEST(ElasticAgent, AnAgentInterruptedWhileWaitingForTheStoreSaysSoAndExitsWith130) {
  testing::HeldPort silent;
  testing::ScratchDir dir;
  const std::string output = dir / "agent";
  std::vector<std::string> argv{"sh", "-c", "exec \"$@\" > '" + output + "' 2>&1", "sh"};
  const std::vector<std::string> agent =
      agent_argv(silent.port(), "interrupted", {}, "true", "2", kAgentConf);
  argv.insert(argv.end(), agent.begin(), agent.end());
  testing::BackgroundProcess process(argv);
  const auto give_up = std::chrono::steady_clock::now() + kAgentDeadline / 2;
  while (testing::read_file(output).find("waiting for the elastic job's store") == std::string::npos &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(testing::read_file(output).find("waiting for the elastic job's store"), std::string::npos)
      << testing::read_file(output);
  ::kill(-process.pid(), SIGINT);
  const ProcessResult result = process.finish(kAgentDeadline);
  const std::string said = testing::read_file(output);
  EXPECT_FALSE(result.timed_out) << said;
  EXPECT_EQ(result.term_signal, 0) << said;
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << said;
  EXPECT_NE(said.find("tandem run: received SIGINT while waiting for the elastic job's store; no worker was running"),
            std::string::npos)
      << said;
}

}  // namespace
}  // namespace tandem
