// The checkpoints of a run dir: the newest is found by the numbers in the names, temp files of unfinished writes
// are not checkpoints, and pruning keeps the newest.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"

namespace tandem::checkpoint {
namespace {

using testing::make_temp_dir;

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

}  // namespace
}  // namespace tandem::checkpoint
