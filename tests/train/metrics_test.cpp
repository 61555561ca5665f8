// metrics.jsonl: one JSON line per epoch, and what a resumed run keeps of it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/tiny_datasets.h"
#include "tandem/train/metrics.h"

namespace tandem::train {
namespace {

using testing::make_temp_dir;

TEST(Metrics, WritesOneJsonLinePerEpoch) {
  const std::string path = make_temp_dir("metrics") + "/metrics.jsonl";
  {
    JsonLinesFile writer(path, "epoch", 0);
    EpochMetrics m;
    m.epoch = 0;
    m.accuracy = 0.5;
    m.correct = 5;
    m.total = 10;
    writer.append(to_json_line(m));
    m.epoch = 1;
    writer.append(to_json_line(m));
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
    JsonLinesFile writer(path, "epoch", 2);
    EpochMetrics m;
    m.epoch = 2;
    m.accuracy = 0.25;
    m.correct = 1;
    m.total = 4;
    writer.append(to_json_line(m));
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
