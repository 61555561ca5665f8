// `tandem run` across two hosts, as users run it on two machines: each host is a network namespace with its own
// address (support/network_namespaces.h), and each runs its own launcher with --nnodes 2, training a small real
// job over gloo. Then one host's link goes down mid-training, as a pulled cable would, and the other's launcher
// must end within --timeout, naming the rank it lost. Skipped where namespaces cannot be made (not root).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include "support/network_namespaces.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::NetworkNamespaces;
using testing::ProcessResult;
using testing::ScratchDir;

// Both launchers' deadline for a job that should succeed: rendezvous, one short epoch, evaluation.
constexpr auto kJobDeadline = 120s;
// --timeout of the link-down run, and how much later than it the survivor may end (the second the collective
// tracker watches heartbeats, the launcher stopping, a loaded machine).
constexpr int kTimeoutSeconds = 10;
constexpr auto kExitMargin = 15s;

using testing::read_file;

// `tandem run` for node `host` of two, one worker each, node 0's address as the master, then `tandem train`.
std::vector<std::string> launch_on(const NetworkNamespaces& hosts, int host, const std::vector<std::string>& run_flags,
                                   const std::vector<std::string>& train_flags) {
  std::vector<std::string> argv{testing::tandem_cli(), "run", "--nnodes", "2", "--node-rank", std::to_string(host),
                                "--nproc-per-node", "1", "--master-addr", hosts.address(0), "--master-port", "29500"};
  argv.insert(argv.end(), run_flags.begin(), run_flags.end());
  argv.insert(argv.end(), {"--", testing::tandem_cli(), "train", "--backend", "gloo", "--threads", "1"});
  argv.insert(argv.end(), train_flags.begin(), train_flags.end());
  return hosts.on_host(host, argv);
}

TEST(MultiHost, GlooTrainsAcrossTwoHosts) {
  NetworkNamespaces hosts;
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  ScratchDir dir;
  const std::string data = testing::write_tiny_mnist("multi_host_data", 256, 64);
  std::vector<std::future<ProcessResult>> launchers;
  for (int host = 0; host < 2; ++host) {
    auto argv = launch_on(hosts, host, {},
                          {"--data", data, "--epochs", "1", "--batch-size", "16", "--timeout", "60", "--run-dir",
                           dir / ("run" + std::to_string(host))});
    launchers.push_back(std::async(std::launch::async, [argv] { return testing::run_process(argv, {}, kJobDeadline); }));
  }
  std::vector<ProcessResult> results;
  for (auto& launcher : launchers) results.push_back(launcher.get());
  for (int host = 0; host < 2; ++host) {
    const ProcessResult& result = results[static_cast<size_t>(host)];
    EXPECT_FALSE(result.timed_out) << "host " << host << " hung:\n" << result.output;
    EXPECT_EQ(result.exit_code, 0) << "host " << host << ":\n" << result.output;
  }
  // Rank 0 reports the world it trained in, and an evaluation that needed rank 1's half of the test set.
  EXPECT_TRUE(std::regex_search(results[0].output, std::regex("\\[0\\]   world size: +2\n"))) << results[0].output;
  EXPECT_TRUE(std::regex_search(results[0].output, std::regex("\\[0\\] \\[epoch 0\\] loss [0-9.]+ accuracy")))
      << results[0].output;
}

TEST(MultiHost, LosingAHostEndsTheOtherWithinTheTimeoutNamingTheLostRank) {
  NetworkNamespaces hosts;
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  ScratchDir dir;
  // 320 images in batches of 16 on two ranks: ten steps an epoch, a progress line each; far more epochs than
  // the test waits for, so the job is mid-training when the link goes down.
  const std::string data = testing::write_tiny_mnist("lost_host_data", 320, 32);
  const std::string timeout = std::to_string(kTimeoutSeconds);
  auto train_flags = [&](int host) {
    return std::vector<std::string>{"--data", data, "--epochs", "1000", "--batch-size", "16", "--timeout", timeout,
                                    "--run-dir", dir / ("run" + std::to_string(host))};
  };
  testing::BackgroundProcess survivor(launch_on(hosts, 0, {"--log-dir", dir / "logs0"}, train_flags(0)));
  testing::BackgroundProcess cut_off(launch_on(hosts, 1, {}, train_flags(1)));

  // Both ranks are training once rank 0 has finished a step.
  const std::regex trained_a_step("batch [1-9][0-9]*/");
  const auto give_up = std::chrono::steady_clock::now() + kJobDeadline;
  while (!std::regex_search(read_file(dir / "logs0/rank0.log"), trained_a_step)) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up)
        << "rank 0 never finished a step:\n" << survivor.finish(1s).output << cut_off.finish(1s).output;
    std::this_thread::sleep_for(20ms);
  }
  std::string error;
  ASSERT_TRUE(hosts.take_link_down(1, error)) << error;
  const auto link_down = std::chrono::steady_clock::now();

  ProcessResult result = survivor.finish(std::chrono::seconds(kTimeoutSeconds) + kExitMargin);
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - link_down).count();
  ASSERT_FALSE(result.timed_out) << "host 0 still ran " << took << " s after host 1's link went down:\n"
                                 << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::regex_search(result.output,
                                std::regex("\\[0\\] .*timed out after " + timeout + " s: lost rank\\(s\\) 1: ")))
      << result.output;
  EXPECT_TRUE(std::regex_search(result.output, std::regex("tandem run: rank 0 exited with code [1-9]")))
      << result.output;
  std::cout << "host 0 ended " << took << " s after host 1's link went down (--timeout " << timeout << ")\n";

  // The host that was cut off ends too: its collective times out, then so does the store it cannot reach.
  ProcessResult lost = cut_off.finish(std::chrono::seconds(3 * kTimeoutSeconds) + kExitMargin);
  EXPECT_FALSE(lost.timed_out) << lost.output;
  EXPECT_NE(lost.exit_code, 0) << lost.output;
}

}  // namespace
}  // namespace tandem
