// Which run dir a run takes: the newest run is found by the numbers in its name, and a new one's timestamped name
// gets a suffix when that second is taken.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/train/run_directory.h"

namespace tandem::train {
namespace {

using testing::make_temp_dir;

TEST(Checkpoint, NewestRunIsTheLatestTimestampThenTheHighestSuffix) {
  const std::string runs = make_temp_dir("runs");
  EXPECT_EQ(newest_run_dir(runs), "");
  for (const char* name : {"20240501-120000", "20240501-120000-9", "20240501-120000-10", "20240430-235959-11"}) {
    ::mkdir((runs + "/" + name).c_str(), 0755);
    std::ofstream(checkpoint::checkpoint_path(runs + "/" + name, 1, 0)) << "x";
  }
  ::mkdir((runs + "/20240501-120000-12").c_str(), 0755);  // started, but no checkpoint yet
  EXPECT_EQ(newest_run_dir(runs), runs + "/20240501-120000-10");
}

TEST(RunDirectory, TimestampedNamesGetASuffixWhenTheSecondIsTaken) {
  const std::string runs = make_temp_dir("timestamped");
  const std::string first = timestamped_run_dir(runs);
  ASSERT_EQ(first.rfind(runs + "/", 0), 0u) << first;
  std::filesystem::create_directories(first);
  const std::string second = timestamped_run_dir(runs);
  // Within the same second the name is taken, so a suffix is added; a second later the stamp itself differs.
  EXPECT_NE(second, first);
  EXPECT_FALSE(std::filesystem::exists(second));
}

}  // namespace
}  // namespace tandem::train
