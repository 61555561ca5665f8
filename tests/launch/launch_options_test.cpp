// The launcher's pure parts: defaults and checks of the flags, the environment each worker gets, and the
// cutting of output into whole lines. No processes are started here.
#include <gtest/gtest.h>

#include <map>

#include "tandem/comm/rank_layout.h"
#include "tandem/launch/launch_options.h"
#include "tandem/launch/line_buffer.h"
#include "tandem/launch/worker_environment.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

comm::EnvLookup fake_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto found = values.find(name);
    if (found == values.end()) return std::nullopt;
    return found->second;
  };
}

LaunchOptions with_command() {
  LaunchOptions options;
  options.command = {"./train"};
  return options;
}

// `limits`: none unless a test gives some, so that the test's own ulimits never decide.
void expect_invalid(const LaunchOptions& options, int gpu_count, const std::string& needle,
                    const ProcessLimits& limits = {}) {
  try {
    plan_launch(options, gpu_count, limits);
    ADD_FAILURE() << "accepted; expected an error containing: " << needle;
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(PlanLaunch, DefaultsToOneWorkerPerGpuElseOne) {
  EXPECT_EQ(plan_launch(with_command(), 0).nproc_per_node, 1);
  EXPECT_EQ(plan_launch(with_command(), 4).nproc_per_node, 4);
  LaunchOptions listed = with_command();
  listed.gpus = {2, 7};
  EXPECT_EQ(plan_launch(listed, 8).nproc_per_node, 2);
}

TEST(PlanLaunch, LeavesTheFreePortOfOneNodeToTheLauncherAndAgreesOnOneForSeveral) {
  // 0: launch() binds a free port when it starts the store, and holds it; the plan binds nothing.
  LaunchPlan single = plan_launch(with_command(), 0);
  EXPECT_EQ(single.master_port, 0);
  EXPECT_EQ(single.master_addr, "127.0.0.1");

  LaunchOptions zero = with_command();
  zero.master_port = 0;
  EXPECT_EQ(plan_launch(zero, 0).master_port, 0);

  LaunchOptions given = with_command();
  given.master_port = 29511;
  given.master_addr = "127.0.0.2";
  EXPECT_EQ(plan_launch(given, 0).master_port, 29511);

  LaunchOptions multi = with_command();
  multi.nnodes = 2;
  multi.node_rank = 1;
  multi.master_addr = "head";
  LaunchPlan plan = plan_launch(multi, 0);
  EXPECT_EQ(plan.master_port, comm::kDefaultMasterPort);
  EXPECT_EQ(plan.world_size(), 2);
  EXPECT_EQ(plan.global_rank(0), 1);
}

TEST(PlanLaunch, RejectsImpossibleLayouts) {
  LaunchOptions options = with_command();
  options.command.clear();
  expect_invalid(options, 0, "no command to run");

  options = with_command();
  options.gpus = {2, 7};
  options.nproc_per_node = 3;
  expect_invalid(options, 8, "`nproc_per_node` 3 asks for more ranks than the 2 GPU(s) listed in `gpus` 2,7");

  options = with_command();
  options.nnodes = 2;
  options.node_rank = 2;
  options.master_addr = "head";
  expect_invalid(options, 0, "`node_rank` 2 is outside 0..1");

  options = with_command();
  options.nnodes = 2;
  expect_invalid(options, 0, "needs `master_addr`");

  options = with_command();
  options.nnodes = 2;
  options.master_addr = "head";
  options.master_port = 0;
  expect_invalid(options, 0, "`master_port` 0 picks a port on this machine only");

  options = with_command();
  options.master_port = 70000;
  expect_invalid(options, 0, "`master_port` 70000");

  // One node's store stays on this machine.
  for (const std::string address : {"10.0.0.1", "0.0.0.0", "localhost", "::1"}) {
    options = with_command();
    options.master_addr = address;
    expect_invalid(options, 0, "`master_addr` " + address + " with `nnodes` 1");
  }

  options = with_command();
  options.nproc_per_node = 0;
  expect_invalid(options, 0, "`nproc_per_node` must be at least 1");

  options = with_command();
  options.max_restarts = -1;
  expect_invalid(options, 0, "`max_restarts` must not be negative");

  options = with_command();
  options.nnodes = 2;
  options.master_addr = "head";
  options.max_restarts = 1;
  expect_invalid(options, 0, "`max_restarts` 1 with `nnodes` 2");

  options = with_command();
  options.gpus = {1, 1};
  expect_invalid(options, 0, "GPU 1 twice");
}

// A node holds what its limits allow, checked before the first worker starts: `tandem run --nproc-per-node
// 100000` forked about 10,000 workers over two minutes before the launcher ran out of open files.
TEST(PlanLaunch, RefusesMoreWorkersThanTheNodeCanHold) {
  LaunchOptions options = with_command();
  options.nproc_per_node = kMaxWorkersPerNode + 1;
  expect_invalid(options, 0,
                 "`nproc_per_node` " + std::to_string(kMaxWorkersPerNode + 1) +
                     " is more workers than tandem run starts on one node (at most " +
                     std::to_string(kMaxWorkersPerNode) + ")");
  options.nproc_per_node = kMaxWorkersPerNode;
  EXPECT_EQ(plan_launch(options, 0, ProcessLimits{}).nproc_per_node, kMaxWorkersPerNode);

  // 64 files of the launcher's own and 2 per worker (3 with a log directory): 1024 open files hold 480 workers.
  ProcessLimits limits;
  limits.open_files = 1024;
  options.nproc_per_node = 481;
  expect_invalid(options, 0, "may open 1024 (ulimit -n); start at most 480 workers per node", limits);
  options.nproc_per_node = 480;
  EXPECT_EQ(plan_launch(options, 0, limits).nproc_per_node, 480);
  options.log_dir = "logs";
  expect_invalid(options, 0, "start at most 320 workers per node", limits);

  limits = ProcessLimits{};
  limits.processes = 100;
  options.nproc_per_node = 101;
  expect_invalid(options, 0, "`nproc_per_node` 101 is more processes than this user may run (100, ulimit -u)",
                 limits);
}

TEST(PlanLaunch, RefusesMoreRanksThanAJobCanCount) {
  LaunchOptions options = with_command();
  options.nnodes = 1 << 30;
  options.nproc_per_node = 4;
  options.master_addr = "head";
  expect_invalid(options, 0, "more ranks than a job can have");
}

TEST(ParseGpuList, ReadsCommaSeparatedIndices) {
  EXPECT_EQ(parse_gpu_list("2,7"), (std::vector<int>{2, 7}));
  EXPECT_EQ(parse_gpu_list(""), (std::vector<int>{}));
  EXPECT_THROW(parse_gpu_list("2,x"), InvalidArgument);
  EXPECT_THROW(parse_gpu_list("2,,3"), InvalidArgument);
  EXPECT_THROW(parse_gpu_list("-1"), InvalidArgument);
}

TEST(WorkerEnvironment, SetsTheTorchrunVariables) {
  LaunchOptions options = with_command();
  options.nnodes = 2;
  options.node_rank = 1;
  options.nproc_per_node = 4;
  options.master_addr = "head";
  options.master_port = 1234;
  options.gpus = {0, 1, 2, 5};
  LaunchPlan plan = plan_launch(options, 0);
  auto env = worker_environment(plan, 2, 0, fake_env({}), 16);
  EXPECT_EQ(env.at("RANK"), "6");
  EXPECT_EQ(env.at("LOCAL_RANK"), "2");
  EXPECT_EQ(env.at("WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("GROUP_RANK"), "1");
  EXPECT_EQ(env.at("MASTER_ADDR"), "head");
  EXPECT_EQ(env.at("MASTER_PORT"), "1234");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "0,1,2,5");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "0");

  // What the workers' own rank detection makes of it.
  comm::RankLayout layout = comm::detect_rank_layout({}, fake_env(env));
  EXPECT_EQ(layout.rank, 6);
  EXPECT_EQ(layout.node_rank, 1);
  EXPECT_EQ(layout.local_world_size, 4);
}

TEST(WorkerEnvironment, OmpThreadsAtLeastOneAndKeptWhenPreset) {
  LaunchOptions options = with_command();
  options.nproc_per_node = 4;
  LaunchPlan plan = plan_launch(options, 0);
  EXPECT_EQ(worker_environment(plan, 0, 0, fake_env({}), 2).at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(worker_environment(plan, 0, 0, fake_env({{"OMP_NUM_THREADS", "3"}}), 64).count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(worker_environment(plan, 0, 0, fake_env({}), 2).count("CUDA_VISIBLE_DEVICES"), 0u);
}

TEST(WorkerEnvironment, CountsRestartsAsTorchrunDoes) {
  LaunchOptions options = with_command();
  options.nproc_per_node = 2;
  options.max_restarts = 3;
  LaunchPlan plan = plan_launch(options, 0);
  auto env = worker_environment(plan, 1, 2, fake_env({}), 4);
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(comm::detect_rank_layout({}, fake_env(env)).restart_count, 2);
}

TEST(LineBuffer, PassesOnWholeLinesAndTheLastPartialOne) {
  LineBuffer buffer;
  std::vector<std::string> lines;
  auto sink = [&](const std::string& line, bool partial) {
    EXPECT_FALSE(partial) << line;
    lines.push_back(line);
  };
  buffer.feed("a\nb", 3, sink);
  EXPECT_EQ(lines, (std::vector<std::string>{"a"}));
  buffer.feed("c\n\nd", 4, sink);
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "bc", ""}));
  buffer.flush(sink);
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "bc", "", "d"}));
  buffer.flush(sink);
  EXPECT_EQ(lines.size(), 4u);
}

TEST(LineBuffer, SplitsALineThatNeverEnds) {
  LineBuffer buffer;
  std::vector<std::string> lines;
  std::string endless(LineBuffer::kMaxLine + 10, 'x');
  buffer.feed(endless.data(), endless.size(), [&](const std::string& line, bool) { lines.push_back(line); });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), LineBuffer::kMaxLine);
}

TEST(LineBuffer, PassesOnARedrawnLineAsItStandsAndKeepsOnlyTheStateItsNewlineCompletes) {
  LineBuffer buffer;
  std::vector<std::pair<std::string, bool>> seen;
  auto sink = [&](const std::string& line, bool partial) { seen.emplace_back(line, partial); };
  buffer.feed("\r1/3", 4, sink);
  buffer.feed("\r2/3\r3", 6, sink);
  buffer.feed("/3\ndone\n", 9, sink);
  const std::vector<std::pair<std::string, bool>> expected{
      {"1/3", true}, {"3", true}, {"3/3", false}, {"done", false}};
  EXPECT_EQ(seen, expected);
}

TEST(LineBuffer, ACarriageReturnBeforeTheNewlineEndsTheLineItFollows) {
  LineBuffer buffer;
  std::vector<std::pair<std::string, bool>> seen;
  auto sink = [&](const std::string& line, bool partial) { seen.emplace_back(line, partial); };
  buffer.feed("windows\r\nunix\n", 14, sink);
  buffer.feed("bar\r", 4, sink);
  buffer.flush(sink);
  const std::vector<std::pair<std::string, bool>> expected{{"windows", false}, {"unix", false}, {"bar", false}};
  EXPECT_EQ(seen, expected);
}

}  // namespace
}  // namespace tandem::launch
