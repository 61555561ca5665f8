// Every training sample is trained once in each epoch across an elastic job's changes: three hosts (network
// namespaces, root only), a host killed mid-epoch, the two left going on from the newest checkpoint at world
// size 2, the host coming back at 3. The instrument is in the test, not the product: the workers are this test
// binary training through train::Loop on a data set whose rows carry their own index in an extra column; the
// model records the indices of each batch it trains on, and each completed optimizer step (on_step) writes them
// to a log of its round and rank. The test then keeps, of every round, the steps up to the one the next round
// resumed from (the next round's first step - 1: what a killed round trained after its checkpoint is redone),
// and counts each sample of each epoch.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/network_namespaces.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"
#include "tandem/comm/process_group.h"
#include "tandem/train/loop.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kSamples = 480;
constexpr int64_t kEvalOffset = 1000000;  // evaluation rows carry index + this, so the model skips them

// The rows of `inner` with their index appended as a ninth column (exact in float up to 2^24).
class IndexedRows : public data::Dataset {
 public:
  IndexedRows(std::shared_ptr<const data::Dataset> inner, int64_t offset) : inner_(std::move(inner)), offset_(offset) {}
  int64_t size() const override { return inner_->size(); }
  data::Batch get_batch(const std::vector<int64_t>& indices) const override {
    data::Batch batch = inner_->get_batch(indices);
    auto tags = torch::tensor(indices, torch::kFloat32).add(static_cast<double>(offset_)).unsqueeze(1);
    batch.data = torch::cat({batch.data, tags}, 1);
    return batch;
  }

 private:
  std::shared_ptr<const data::Dataset> inner_;
  int64_t offset_;
};

// The indices the model saw since the last completed step (training thread only).
std::vector<int64_t>& seen_indices() {
  static std::vector<int64_t> seen;
  return seen;
}

struct IndexRecordingNetImpl : torch::nn::Module {
  IndexRecordingNetImpl() { fc = register_module("fc", torch::nn::Linear(8, 2)); }
  torch::Tensor forward(torch::Tensor x) {
    const auto tags = x.select(1, 8).to(torch::kInt64);
    for (int64_t i = 0; i < tags.size(0); ++i) {
      if (tags[i].item<int64_t>() < kEvalOffset) seen_indices().push_back(tags[i].item<int64_t>());
    }
    return fc->forward(x.narrow(1, 0, 8));
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(IndexRecordingNet);

TEST(ElasticSamplesWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "a rank of ElasticSamples.EachSampleOnceAnEpochAcrossChanges";
  init_process_group();
  const std::string log_path = std::string(std::getenv("TEST_LOG_DIR")) + "/round" +
                               std::getenv("TORCHELASTIC_RESTART_COUNT") + "-rank" + std::getenv("RANK") + ".log";
  std::ofstream log(log_path, std::ios::app);
  torch::manual_seed(0);
  IndexRecordingNet model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
  train::LoopOptions options;
  options.epochs = 3;
  options.batch_size = 16;
  options.drop_last = false;  // every sample, the last partial batch too
  options.checkpoint_every = 2;
  options.seed = 4;
  train::Loop loop(options);
  loop.callbacks().on_step = [&](const train::StepInfo& step) {
    log << step.step << " " << step.epoch;
    for (int64_t index : seen_indices()) log << " " << index;
    log << std::endl;
    seen_indices().clear();
    // Paced, so that the test can take a host away mid-epoch.
    std::this_thread::sleep_for(60ms);
  };
  loop.fit(model, optimizer, std::make_shared<IndexedRows>(testing::separable_set(kSamples, 1), 0),
           std::make_shared<IndexedRows>(testing::separable_set(96, 2), kEvalOffset));
  destroy_process_group();
}

struct LoggedStep {
  int epoch = 0;
  std::vector<int64_t> indices;
};

// Every round's logs: round -> rank -> step -> what that rank trained in it.
std::map<int, std::map<int, std::map<int64_t, LoggedStep>>> read_logs(const std::string& folder) {
  std::map<int, std::map<int, std::map<int64_t, LoggedStep>>> rounds;
  const std::regex name("round(\\d+)-rank(\\d+)\\.log");
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, match, name)) continue;
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      int64_t step = 0;
      LoggedStep logged;
      words >> step >> logged.epoch;
      for (int64_t index; words >> index;) logged.indices.push_back(index);
      rounds[std::stoi(match[1])][std::stoi(match[2])][step] = logged;
    }
  }
  return rounds;
}

TEST(ElasticSamples, EachSampleOnceAnEpochAcrossChanges) {
  testing::NetworkNamespaces hosts(3);
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  testing::ScratchDir dir;
  const std::string logs = dir / "samples";
  std::filesystem::create_directories(logs);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::map<int, std::unique_ptr<testing::BackgroundProcess>> agents;
  const auto start = [&](int host) {
    const std::string command =
        "cd '" + dir.path() + "' && exec '" + testing::tandem_cli() +
        "' run --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint " + hosts.address(0) +
        ":29400 --rdzv-id samples --rdzv-conf keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,"
        "join_timeout=30 --max-restarts 3 --grace-period 2 -- '" + self +
        "' --gtest_filter=ElasticSamplesWorker.Run";
    agents[host] = std::make_unique<testing::BackgroundProcess>(
        hosts.on_host(host, {"sh", "-c", command}),
        std::map<std::string, std::string>{
            {"TANDEM_TEST_WORKER", "1"}, {"OMP_NUM_THREADS", "1"}, {"TEST_LOG_DIR", logs}});
  };
  for (int host = 0; host < 3; ++host) start(host);

  // Wait for step 7 (mid-epoch 0 of ten steps at world size 3), then take host 2 away.
  const auto reached = [&](int64_t step, int round_at_least) {
    for (const auto& [round, ranks] : read_logs(logs)) {
      if (round < round_at_least) continue;
      for (const auto& [rank, steps] : ranks) {
        if (!steps.empty() && steps.rbegin()->first >= step) return true;
      }
    }
    return false;
  };
  const auto wait_until = [&](const std::function<bool()>& done, const std::string& what) {
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= give_up) {
        ADD_FAILURE() << what;
        return false;
      }
      std::this_thread::sleep_for(20ms);
    }
    return true;
  };
  ASSERT_TRUE(wait_until([&] { return reached(7, 0); }, "step 7 never came"));
  ::kill(-agents[2]->pid(), SIGKILL);
  agents[2]->finish(10s);
  // Host 2 comes back once the two left have trained a few steps on their own.
  ASSERT_TRUE(wait_until([&] { return read_logs(logs).size() >= 2 && reached(12, 1); }, "no round without host 2"));
  start(2);
  for (auto& [host, agent] : agents) {
    const testing::ProcessResult result = agent->finish(120s);
    EXPECT_EQ(result.exit_code, 0) << "host " << host << ":\n" << result.output;
  }

  // The timeline: each round's steps replace those from its first step on.
  std::map<int64_t, std::vector<LoggedStep>> timeline;  // step -> every rank's
  std::map<int, int> world_of_round;
  int64_t redone = 0;
  for (const auto& [round, ranks] : read_logs(logs)) {
    int64_t first = INT64_MAX;
    for (const auto& [rank, steps] : ranks) {
      if (!steps.empty()) first = std::min(first, steps.begin()->first);
    }
    redone += std::distance(timeline.lower_bound(first), timeline.end());
    timeline.erase(timeline.lower_bound(first), timeline.end());
    for (const auto& [rank, steps] : ranks) {
      for (const auto& [step, logged] : steps) timeline[step].push_back(logged);
    }
    world_of_round[round] = static_cast<int>(ranks.size());
  }
  std::cout << redone << " step(s) trained after a checkpoint by a round that ended, and redone\n";
  std::set<int> worlds;
  for (const auto& [round, world] : world_of_round) worlds.insert(world);
  EXPECT_EQ(worlds, (std::set<int>{2, 3})) << "the job should have run at world sizes 3 and 2";

  // Per epoch: every sample at least once, and no more repeats than the sampler's padding allows (at most
  // world size - 1 per stretch of an epoch at one world size: up to 2 per round).
  std::map<int, std::map<int64_t, int>> counts;
  for (const auto& [step, ranks] : timeline) {
    for (const LoggedStep& logged : ranks) {
      for (int64_t index : logged.indices) ++counts[logged.epoch][index];
    }
  }
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [epoch, seen] : counts) {
    int64_t repeats = 0;
    for (int64_t index = 0; index < kSamples; ++index) {
      const auto found = seen.find(index);
      EXPECT_NE(found, seen.end()) << "sample " << index << " never trained in epoch " << epoch;
      if (found != seen.end()) repeats += found->second - 1;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), kSamples) << "epoch " << epoch;
    EXPECT_LE(repeats, 2 * static_cast<int64_t>(world_of_round.size())) << "epoch " << epoch;
    std::cout << "epoch " << epoch << ": " << seen.size() << " samples, " << repeats << " padding repeat(s)\n";
  }
}

}  // namespace
}  // namespace tandem
