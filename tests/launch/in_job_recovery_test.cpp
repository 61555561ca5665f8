// In-job recovery (docs/recovery.md) with real processes on loopback: `tandem run --recovery in-job` keeps the
// survivors of a SIGKILLed worker training, and takes its replacement in, healed over the network.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"

namespace tandem::testing {
namespace {

// `tandem run LAUNCHER_ARGS -- sh -c '... exec tandem train TRAIN_ARGS'` in `cwd`: every worker process that
// starts appends its pid to pids.<RANK> first, so that the test sees which ranks were started again (the product
// is not asked).
ProcessResult run_recording_pids(const std::string& cwd, const std::vector<std::string>& launcher_args,
                                 const std::vector<std::string>& train_args,
                                 const std::map<std::string, std::string>& env = {}) {
  std::string worker = "echo \\$\\$ >> pids.\\$RANK && exec '" + tandem_cli() + "' train";
  for (const auto& arg : train_args) worker += " " + arg;
  std::string command = "cd '" + cwd + "' && exec '" + tandem_cli() + "' run";
  for (const auto& arg : launcher_args) command += " '" + arg + "'";
  command += " -- sh -c \"" + worker + "\"";
  return run_process({"sh", "-c", command}, env, std::chrono::seconds(150));
}

std::vector<nlohmann::json> steps_of(const std::string& run_dir) {
  std::vector<nlohmann::json> steps;
  for (const std::string& line : read_lines(run_dir + "/steps.jsonl")) steps.push_back(nlohmann::json::parse(line));
  return steps;
}

TEST(InJobRecovery, AKilledWorkerLeavesTheOthersTrainingAndItsReplacementIsHealedLive) {
  // 1,920 samples, batch 16 on 3 ranks: 40 steps an epoch, 3 epochs; rank 1 dies before step 6, long before the
  // run ends, so that its replacement has the rest of the run to start in.
  const std::string data = write_tiny_mnist("in_job_data", 1920, 48);
  const std::string cwd = make_temp_dir("in_job_killed");
  const std::vector<std::string> train_args = {"--data", data, "--epochs", "3", "--batch-size", "16",
                                               "--threads", "1", "--seed", "5", "--timeout", "60",
                                               "--checkpoint-every", "4", "--check-replicas-every", "1",
                                               "--run-dir", "run", "--no-tensorboard", "--no-report"};
  const ProcessResult result =
      run_recording_pids(cwd, {"--nproc-per-node", "3", "--max-restarts", "1", "--recovery", "in-job"}, train_args,
                         {{"TANDEM_KILL_AT", "step:1:6"}});
  ASSERT_FALSE(result.timed_out) << result.output;
  // --check-replicas-every 1 compares the replicas at every step: a divergence ends the run non-zero.
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("go on without it (in-job recovery); starting its replacement"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("rank 1's replacement is taken in"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("restarting all"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("resuming from"), std::string::npos) << "no checkpoint may be read:\n" << result.output;

  // The survivors kept their processes; only rank 1 was started again.
  EXPECT_EQ(read_lines(cwd + "/pids.0").size(), 1u);
  EXPECT_EQ(read_lines(cwd + "/pids.2").size(), 1u);
  EXPECT_EQ(read_lines(cwd + "/pids.1").size(), 2u);

  const std::vector<nlohmann::json> steps = steps_of(cwd + "/run");
  std::vector<int> worlds;
  std::vector<int64_t> epoch_samples(3, 0);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1)) << "each step once, none trained again";
    const int world = steps[i]["world_size"].get<int>();
    if (worlds.empty() || worlds.back() != world) worlds.push_back(world);
    const auto epoch = steps[i]["epoch"].get<size_t>();
    ASSERT_LT(epoch, 3u);
    epoch_samples[epoch] += steps[i]["samples"].get<int64_t>();
  }
  EXPECT_EQ(worlds, (std::vector<int>{3, 2, 3})) << "the world goes from 3 to 2 ranks, and back to 3";
  // No sample twice in an epoch: a change of world cuts the epoch's order into parts at the position its finished
  // batches reach, and only an epoch's last part drops a partial batch (under 3 ranks x 16 samples).
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_LE(epoch_samples[epoch], 1920) << "epoch " << epoch;
    EXPECT_GT(epoch_samples[epoch], 1920 - 48) << "epoch " << epoch;
  }
}

// Two ranks, the second killed before step 9 of 10: the survivor trains on alone and ends the run, whether or
// not its replacement was taken in first; a replacement still waiting then ends by itself, and the run succeeds.
TEST(InJobRecovery, ASurvivorThatEndsTheRunBeforeTheReplacementJoinsEndsItWell) {
  const std::string data = write_tiny_mnist("in_job_late_data", 320, 16);
  const std::string cwd = make_temp_dir("in_job_late");
  const ProcessResult result = run_recording_pids(
      cwd, {"--nproc-per-node", "2", "--max-restarts", "1", "--recovery", "in-job"},
      {"--data", data, "--epochs", "1", "--batch-size", "16", "--threads", "1", "--timeout", "60", "--run-dir", "run",
       "--no-tensorboard", "--no-report"},
      {{"TANDEM_KILL_AT", "step:1:9"}});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("go on without it (in-job recovery)"), std::string::npos) << result.output;
  EXPECT_EQ(read_lines(cwd + "/pids.0").size(), 1u);
  const std::vector<nlohmann::json> steps = steps_of(cwd + "/run");
  // 8 steps of 2 x 16 samples before the kill, and the other 64 in 4 steps of rank 0 alone.
  ASSERT_EQ(steps.size(), 12u);
  EXPECT_EQ(steps.back()["world_size"].get<int>(), 1);
}

// A second loss during recovery, and of the rank that was sending the heal: rank 1 dies before step 6, and rank 2,
// the member that sends its replacement the state, dies half way through sending it. The members (rank 0 and the
// replacement) form the next membership and heal there from rank 0; rank 2's replacement joins later.
TEST(InJobRecovery, TheRankSendingTheHealIsLostTooAndTheOthersHealAgainWithoutIt) {
  const std::string data = write_tiny_mnist("in_job_heal_data", 1920, 48);
  const std::string cwd = make_temp_dir("in_job_heal_lost");
  const ProcessResult result = run_recording_pids(
      cwd, {"--nproc-per-node", "3", "--max-restarts", "2", "--recovery", "in-job"},
      {"--data", data, "--epochs", "3", "--batch-size", "16", "--threads", "1", "--seed", "5", "--timeout", "60",
       "--check-replicas-every", "1", "--run-dir", "run", "--no-tensorboard", "--no-report"},
      {{"TANDEM_KILL_AT", "step:1:6,heal-send:2:1"}});
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rank 2 was killed by signal SIGKILL (9); the other"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("a collective failed while the membership changed"), std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("resuming from"), std::string::npos) << result.output;
  EXPECT_EQ(read_lines(cwd + "/pids.0").size(), 1u);
  EXPECT_EQ(read_lines(cwd + "/pids.1").size(), 2u);
  EXPECT_EQ(read_lines(cwd + "/pids.2").size(), 2u);
  const std::vector<nlohmann::json> steps = steps_of(cwd + "/run");
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1)) << "each step once, none trained again";
  }
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back()["world_size"].get<int>(), 3) << "both replacements were taken in";
}

// A worker alive but silent: rank 1 is stopped with SIGSTOP from outside mid-epoch. No collective fails for it
// (its connections stay open); its heartbeat stands still, the launcher kills it after 5 s, and the others go on
// and take its replacement in, long before --timeout (60 s here).
TEST(InJobRecovery, AStoppedWorkerIsKilledWhenItsHeartbeatStandsStillAndTheOthersGoOn) {
  const std::string data = write_tiny_mnist("in_job_stopped_data", 1920, 48);
  const std::string cwd = make_temp_dir("in_job_stopped");
  std::string worker = "echo \\$\\$ >> pids.\\$RANK && exec '" + tandem_cli() + "' train --data '" + data +
                       "' --epochs 3 --batch-size 16 --threads 1 --seed 5 --timeout 60 --check-replicas-every 1 "
                       "--run-dir run --no-tensorboard --no-report";
  BackgroundProcess job({"sh", "-c",
                         "cd '" + cwd + "' && exec '" + tandem_cli() +
                             "' run --nproc-per-node 3 --max-restarts 1 --recovery in-job -- sh -c \"" + worker + "\""});
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_lines(cwd + "/run/steps.jsonl").size() < 6 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::vector<std::string> pids = read_lines(cwd + "/pids.1");
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_EQ(::kill(std::stoi(pids[0]), SIGSTOP), 0);
  const ProcessResult result = job.finish(std::chrono::seconds(150));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rank 1 sent no heartbeat for 5 s (stopped or frozen); killing it"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("rank 1's replacement is taken in"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("resuming from"), std::string::npos) << result.output;
  EXPECT_EQ(read_lines(cwd + "/pids.0").size(), 1u);
  EXPECT_EQ(read_lines(cwd + "/pids.2").size(), 1u);
  std::vector<int> worlds;
  for (const nlohmann::json& step : steps_of(cwd + "/run")) {
    const int world = step["world_size"].get<int>();
    if (worlds.empty() || worlds.back() != world) worlds.push_back(world);
  }
  EXPECT_EQ(worlds, (std::vector<int>{3, 2, 3}));
}

TEST(InJobRecovery, WhereItCannotWorkItIsRefusedInOneLineBeforeTraining) {
  const ProcessResult nodes = run_process(
      {tandem_cli(), "run", "--recovery", "in-job", "--nnodes", "2", "--master-addr", "127.0.0.1", "--", "true"});
  EXPECT_EQ(nodes.exit_code, 2) << nodes.output;
  EXPECT_NE(nodes.output.find("--recovery in-job with --nnodes 2 needs an elastic job"), std::string::npos)
      << nodes.output;

  const ProcessResult unknown = run_process({tandem_cli(), "run", "--recovery", "sometimes", "--", "true"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;

  // Each rank of tandem train refuses what cannot be recovered in the job, before its rendezvous; the launcher
  // does not take a refusal for a lost worker.
  const std::string data = write_tiny_mnist("in_job_refused", 64, 16);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--strategy", "fsdp"}, "--recovery in-job needs --strategy ddp"},
      {{"--zero"}, "--zero cannot be combined with tandem run's --recovery in-job"},
      {{"--uneven"}, "cannot be combined with --uneven"},
  };
  for (const auto& [flags, says] : refused) {
    std::vector<std::string> argv = {tandem_cli(), "run", "--nproc-per-node", "2", "--recovery", "in-job", "--",
                                     tandem_cli(), "train", "--data", data, "--epochs", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ProcessResult result = run_process(argv, {}, std::chrono::seconds(60));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(says), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("go on without it"), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace tandem::testing
