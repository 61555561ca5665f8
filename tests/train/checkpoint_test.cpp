// Checkpoints restore model and optimizer exactly (the next step after loading equals the next step of the
// original), the newest checkpoint and the newest run are found by number, and the cosine schedule matches the
// seeds' lambda.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tandem/nn/cnn_net.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/lr_schedule.h"
#include "tandem/train/metrics.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

std::string make_temp_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "tandem_ckpt_" + std::to_string(::getpid()) + "_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

torch::optim::SGD make_sgd(nn::CnnNet& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.005));
}

void sgd_step(nn::CnnNet& net, torch::optim::SGD& sgd, int64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({4, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {4});
  sgd.zero_grad();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  sgd.step();
}

TEST(Checkpoint, RestoresWeightsAndMomentumSoTheNextStepIsIdentical) {
  const std::string dir = make_temp_dir("restore");
  torch::manual_seed(1);
  nn::CnnNet original;
  auto sgd = make_sgd(original);
  sgd_step(original, sgd, 10);
  sgd_step(original, sgd, 11);
  CheckpointState state;
  state.epoch = 2;
  state.batches_done = 0;
  state.step = 2;
  state.lr = 0.05;
  state.base_lr = 0.05;
  state.lrf = 0.1;
  state.epochs = 10;
  state.sampler_seed = 42;
  state.world_size = 2;
  const std::string path = checkpoint_path(dir, state.epoch, state.batches_done);
  save_checkpoint(path, *original, sgd, state);

  torch::manual_seed(2);  // different initial weights: everything must come from the file
  nn::CnnNet restored;
  auto restored_sgd = make_sgd(restored);
  CheckpointState loaded = load_checkpoint(path, *restored, restored_sgd);
  EXPECT_EQ(loaded.epoch, 2);
  EXPECT_EQ(loaded.step, 2);
  EXPECT_EQ(loaded.sampler_seed, 42u);
  EXPECT_EQ(loaded.world_size, 2);
  EXPECT_DOUBLE_EQ(loaded.lr, 0.05);

  sgd_step(original, sgd, 12);
  sgd_step(restored, restored_sgd, 12);
  auto a = original->named_parameters(), b = restored->named_parameters();
  for (const auto& item : a) {
    EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key() << " differs after the step following a load";
  }
}

TEST(Checkpoint, RefusesAFileThatIsNotACheckpoint) {
  const std::string dir = make_temp_dir("refuse");
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = dir + "/weights.safetensors";
  save_checkpoint(path, *net, sgd, {});
  // A weights-only file (no checkpoint metadata) is refused with the file named.
  std::ofstream(path, std::ios::trunc | std::ios::binary).write("\x02\0\0\0\0\0\0\0{}", 10);
  try {
    load_checkpoint(path, *net, sgd);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

TEST(Checkpoint, FindsTheNewestAndIgnoresTempFiles) {
  const std::string dir = make_temp_dir("latest");
  EXPECT_FALSE(find_latest_checkpoint(dir).has_value());
  for (auto [epoch, batch] : {std::pair{1, 0}, std::pair{10, 0}, std::pair{2, 0}, std::pair{10, 5}}) {
    std::ofstream(checkpoint_path(dir, epoch, batch)) << "x";
  }
  std::ofstream(checkpoint_path(dir, 11, 0) + ".tmp.123") << "partial";
  EXPECT_EQ(find_latest_checkpoint(dir).value(), checkpoint_path(dir, 10, 5));
}

TEST(Checkpoint, NewestComparesTheNumbersInTheNames) {
  const std::string dir = make_temp_dir("numbers");
  // Unpadded names, and numbers wider than checkpoint_path pads them to.
  for (const char* name : {"checkpoint-9-0.safetensors", "checkpoint-10-0.safetensors", "checkpoint-2-7.safetensors"}) {
    std::ofstream(dir + "/" + name) << "x";
  }
  EXPECT_EQ(find_latest_checkpoint(dir).value(), dir + "/checkpoint-10-0.safetensors");
  std::ofstream(checkpoint_path(dir, 9999, 0)) << "x";
  std::ofstream(checkpoint_path(dir, 10000, 0)) << "x";
  EXPECT_EQ(find_latest_checkpoint(dir).value(), checkpoint_path(dir, 10000, 0));
  std::ofstream(checkpoint_path(dir, 10000, 99999999)) << "x";
  std::ofstream(checkpoint_path(dir, 10000, 100000000)) << "x";
  EXPECT_EQ(find_latest_checkpoint(dir).value(), checkpoint_path(dir, 10000, 100000000));
}

TEST(Checkpoint, PruningKeepsTheNewestAndRemovingUnfinishedWritesKeepsEveryCheckpoint) {
  const std::string dir = make_temp_dir("prune");
  for (int batch : {10, 2, 0, 7}) std::ofstream(checkpoint_path(dir, 3, batch)) << "x";
  std::ofstream(checkpoint_path(dir, 4, 0) + ".tmp.77") << "partial";
  std::ofstream(dir + "/metrics.jsonl") << "{}";
  remove_unfinished_checkpoints(dir);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_path(dir, 4, 0) + ".tmp.77"));
  EXPECT_EQ(list_checkpoints(dir).size(), 4u);
  prune_checkpoints(dir, 2);
  EXPECT_EQ(list_checkpoints(dir), (std::vector<std::string>{checkpoint_path(dir, 3, 7), checkpoint_path(dir, 3, 10)}));
  prune_checkpoints(dir, 0);
  EXPECT_EQ(list_checkpoints(dir).size(), 2u) << "0 keeps them all";
  EXPECT_TRUE(std::filesystem::exists(dir + "/metrics.jsonl"));
}

TEST(Checkpoint, NewestRunIsTheLatestTimestampThenTheHighestSuffix) {
  const std::string runs = make_temp_dir("runs");
  EXPECT_EQ(newest_run_dir(runs), "");
  for (const char* name : {"20240501-120000", "20240501-120000-9", "20240501-120000-10", "20240430-235959-11"}) {
    ::mkdir((runs + "/" + name).c_str(), 0755);
    std::ofstream(checkpoint_path(runs + "/" + name, 1, 0)) << "x";
  }
  ::mkdir((runs + "/20240501-120000-12").c_str(), 0755);  // started, but no checkpoint yet
  EXPECT_EQ(newest_run_dir(runs), runs + "/20240501-120000-10");
}

TEST(CosineSchedule, MatchesTheSeedsLambda) {
  const int epochs = 10;
  const double lrf = 0.1;
  CosineSchedule schedule(0.02, lrf, epochs);
  for (int epoch = 0; epoch <= epochs; ++epoch) {
    const double seed_lambda = ((1 + std::cos(epoch * M_PI / epochs)) / 2) * (1 - lrf) + lrf;
    EXPECT_DOUBLE_EQ(schedule.lr(epoch), 0.02 * seed_lambda) << "epoch " << epoch;
  }
  EXPECT_DOUBLE_EQ(schedule.lr(0), 0.02);
  EXPECT_NEAR(schedule.lr(epochs), 0.02 * lrf, 1e-15);
}

TEST(Metrics, WritesOneJsonLinePerEpoch) {
  const std::string path = make_temp_dir("metrics") + "/metrics.jsonl";
  {
    MetricsWriter writer(path, 0);
    EpochMetrics m;
    m.epoch = 0;
    m.accuracy = 0.5;
    m.correct = 5;
    m.total = 10;
    writer.write(m);
    m.epoch = 1;
    writer.write(m);
  }
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1].rfind("{\"epoch\":1,", 0), 0u) << lines[1];
  EXPECT_NE(lines[0].find("\"accuracy\":0.5"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"total\":10"), std::string::npos) << lines[0];
}

TEST(Metrics, AResumedRunDropsTheLinesOfEpochsItTrainsAgainAndATornLine) {
  const std::string path = make_temp_dir("metrics_resume") + "/metrics.jsonl";
  std::ofstream(path) << to_json_line(EpochMetrics{0}) << "\n"
                      << to_json_line(EpochMetrics{1}) << "\n"
                      << to_json_line(EpochMetrics{2}) << "\n"
                      << "{\"epoch\":3,\"lo";  // killed while writing
  {
    MetricsWriter writer(path, 2);
    EpochMetrics m;
    m.epoch = 2;
    m.accuracy = 0.25;
    writer.write(m);
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("{\"epoch\":0,", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("{\"epoch\":1,", 0), 0u) << lines[1];
  EXPECT_NE(lines[2].find("\"accuracy\":0.25"), std::string::npos) << lines[2];
}

}  // namespace
}  // namespace tandem::train
