// Sharded checkpoints at scale (issue 41): the real writer and reader of `--checkpoint-format sharded`
// (checkpoint/fsdp_sharded_checkpoint.h) with 64 simulated ranks, threads of one process around a tiny model. What is
// asserted is the shape, never a time: each rank opens the checkpoint file, the index and its own rank file only,
// once each, and reads no byte of another rank's file; the search for the newest intact checkpoint reads every
// file once, with one rank file open at a time. Beside them, what a damaged index or an open that fails for
// another reason than damage does. RELIABILITY.md, "Sharded checkpoints at 64 and 256 ranks", has the figures of
// the same simulation at 64 and 256 ranks (TANDEM_SCALE_WORLDS=64,256, see ShardedCheckpointScale below).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/optim.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/checkpoint/checksummed_file.h"
#include "src/checkpoint/sharded_index.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_damage.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/checkpoint/fsdp_sharded_checkpoint.h"
#include "tandem/comm/communicator.h"
#include "tandem/fsdp/full_state_view.h"
#include "tandem/fsdp/sharded_model.h"
#include "tandem/util/error.h"
#include "tandem/util/file_read_log.h"

namespace tandem::checkpoint::sharded_checkpoint_scale {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;

// A collective that has completed when it starts.
class Done : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
  void observe_completion(std::function<void()> observer) override { observer(); }
};

// Rank `rank` of a simulated world whose collectives leave every tensor as it is: every rank builds its model
// from the same seed, so a broadcast of rank 0's values is already done, and checkpoints exchange nothing.
class SimulatedRank : public comm::Communicator {
 public:
  SimulatedRank(int rank, int world)
      : Communicator("simulated", c10::make_intrusive<c10d::HashStore>(), rank, world, std::chrono::seconds(30),
                     Capabilities{}) {}

 protected:
  comm::WorkPtr start_all_reduce(torch::Tensor&, comm::ReduceOp) override { return std::make_shared<Done>(); }
  comm::WorkPtr start_broadcast(torch::Tensor&, int) override { return std::make_shared<Done>(); }
  comm::WorkPtr start_all_gather(std::vector<torch::Tensor>&, const torch::Tensor&) override {
    return std::make_shared<Done>();
  }
  comm::WorkPtr start_barrier() override { return std::make_shared<Done>(); }
};

// One rank's model, its shards and the optimizer stepping them (SGD with momentum, so that the checkpoint holds
// per-element state as well).
struct Rank {
  torch::nn::Sequential module{nullptr};
  std::shared_ptr<SimulatedRank> communicator;
  std::unique_ptr<fsdp::ShardedModel> sharded;
  std::unique_ptr<torch::optim::SGD> optimizer;
};

std::vector<std::unique_ptr<Rank>> make_world(int world) {
  std::vector<std::unique_ptr<Rank>> ranks;
  fsdp::FsdpOptions options;
  options.units.module_types = {"Linear"};
  for (int r = 0; r < world; ++r) {
    auto rank = std::make_unique<Rank>();
    torch::manual_seed(5);
    rank->module = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::Tanh(), torch::nn::Linear(64, 4));
    rank->communicator = std::make_shared<SimulatedRank>(r, world);
    rank->sharded = std::make_unique<fsdp::ShardedModel>(*rank->module, rank->communicator, options);
    rank->optimizer = std::make_unique<torch::optim::SGD>(rank->module->parameters(),
                                                          torch::optim::SGDOptions(0.1).momentum(0.9));
    fsdp::shard_optimizer(*rank->sharded, *rank->module, *rank->optimizer);
    for (torch::Tensor& shard : rank->sharded->shards()) shard.mutable_grad() = torch::ones_like(shard);
    rank->optimizer->step();  // every shard gets its momentum buffer
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

// Runs body(rank) on one thread per rank.
void on_every_rank(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> failures(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

// The checkpoint (epoch 1) of `ranks` in `run_dir`, written as the loop writes it: every rank its file, then rank 0
// the index and the checkpoint file, with every rank's generator row as a run saves them.
std::string write_checkpoint(const std::vector<std::unique_ptr<Rank>>& ranks, const std::string& run_dir) {
  const int world = static_cast<int>(ranks.size());
  const std::string path = checkpoint_path(run_dir, 1, 0);
  on_every_rank(world, [&](int r) { write_fsdp_shard_file(path, *ranks[r]->sharded, *ranks[r]->module, *ranks[r]->optimizer); });
  CheckpointState state;
  state.epoch = 1;
  state.world_size = world;
  state.batch_size = 4;
  state.rng = gather_rng_states(nullptr, torch::kCPU);
  state.rng.cpu = state.rng.cpu.repeat({world, 1});
  write_fsdp_checkpoint_file(path, *ranks[0]->sharded, *ranks[0]->module, *ranks[0]->optimizer, state, {});
  return path;
}

int64_t size_of(const std::string& path) { return static_cast<int64_t>(fs::file_size(path)); }

// What one rank read while it loaded the checkpoint.
struct RankReads {
  std::map<std::string, FileReadLog::File> files;
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& [path, file] : files) total += file.bytes;
    return total;
  }
};

std::vector<RankReads> load_on_every_rank(const std::vector<std::unique_ptr<Rank>>& ranks, const std::string& path) {
  std::vector<RankReads> reads(ranks.size());
  on_every_rank(static_cast<int>(ranks.size()), [&](int r) {
    FileReadLog log;
    load_fsdp_sharded_checkpoint(path, *ranks[r]->sharded, *ranks[r]->module, *ranks[r]->optimizer, nullptr);
    reads[r].files = log.files();
  });
  return reads;
}

// The worlds to simulate: 64 in the test suite; TANDEM_SCALE_WORLDS=64,256 for RELIABILITY.md's table.
std::vector<int> worlds() {
  const char* given = std::getenv("TANDEM_SCALE_WORLDS");
  std::vector<int> result;
  std::stringstream list(given && *given ? given : "64");
  for (std::string world; std::getline(list, world, ',');) result.push_back(std::stoi(world));
  return result;
}

TEST(ShardedCheckpointScale, EachRankReadsTheCheckpointFileTheIndexAndItsOwnPiecesOnly) {
  for (const int world : worlds()) {
    SCOPED_TRACE("world " + std::to_string(world));
    const std::string run_dir = make_temp_dir("sharded_scale_" + std::to_string(world));
    const auto ranks = make_world(world);
    const std::string path = write_checkpoint(ranks, run_dir);
    const std::string index = run_dir + "/" + index_file_name(path);
    // What each rank's first shard must hold again: its elements of the unit, then zero padding (the step above
    // moved the padding too, which a checkpoint does not store).
    std::vector<torch::Tensor> saved;
    std::vector<bool> holds_elements;
    for (int r = 0; r < world; ++r) {
      torch::Tensor shard = ranks[r]->sharded->shards().front().detach().clone();
      const fsdp::FlatUnit& unit = *ranks[r]->sharded->units().front();
      const int64_t shard_numel = unit.padded_numel() / world;
      const int64_t held = std::clamp<int64_t>(unit.numel() - r * shard_numel, 0, shard_numel);
      shard.narrow(0, held, shard_numel - held).zero_();
      saved.push_back(shard);
      bool any = false;
      for (const auto& each : ranks[r]->sharded->units()) any = any || r * (each->padded_numel() / world) < each->numel();
      holds_elements.push_back(any);
    }
    for (const auto& rank : ranks) {
      for (torch::Tensor& shard : rank->sharded->shards()) shard.detach().fill_(-7);
    }

    const std::vector<RankReads> reads = load_on_every_rank(ranks, path);
    int64_t most_bytes = 0, fewest_bytes = std::numeric_limits<int64_t>::max(), own_file_bytes = 0;
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const std::string own = run_dir + "/" + shard_file_name(path, r, world);
      // A rank whose shards hold padding only (the last ranks of a world this large for so small a model) has no
      // piece to read.
      std::set<std::string> expected = {path, index};
      if (holds_elements[r]) expected.insert(own);
      std::set<std::string> opened;
      for (const auto& [file, read] : reads[r].files) {
        opened.insert(file);
        EXPECT_EQ(read.opens, 1) << file << " was opened more than once";
        if (file == own) {
          EXPECT_LE(read.bytes, size_of(file)) << file << " was read more than once";
        } else {
          EXPECT_EQ(read.bytes, size_of(file)) << file << " was not read exactly once";
        }
      }
      EXPECT_EQ(opened, expected);
      EXPECT_TRUE(torch::equal(ranks[r]->sharded->shards().front(), saved[r])) << "the shard came back";
      most_bytes = std::max(most_bytes, reads[r].bytes());
      fewest_bytes = std::min(fewest_bytes, reads[r].bytes());
      own_file_bytes = std::max(own_file_bytes, size_of(own));
    }
    // The figures RELIABILITY.md tabulates.
    std::cout << "world " << world << ": checkpoint file " << size_of(path) << " B, index " << size_of(index)
              << " B, largest rank file " << own_file_bytes << " B; per rank: at most 3 files opened, " << fewest_bytes
              << " to " << most_bytes << " B read\n";

    // The search reads every file once, holding one rank file open at a time.
    FileReadLog search;
    EXPECT_EQ(find_latest_intact_checkpoint(run_dir), path);
    int64_t searched = 0, search_bytes = 0;
    for (const auto& [file, read] : search.files()) {
      EXPECT_EQ(read.opens, 1) << file;
      ++searched;
      search_bytes += read.bytes;
    }
    EXPECT_EQ(searched, world + 2);
    std::cout << "world " << world << ": the search (rank 0) opened " << searched << " files, read " << search_bytes
              << " B\n";
  }
}

// Descriptors: this process may open `more` files from now on (RLIMIT_NOFILE just above the lowest free descriptor,
// after the holes below it are filled), until destroyed.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(int more) {
    EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &saved_), 0);
    int highest = 0;
    for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
      highest = std::max(highest, std::stoi(entry.path().filename().string()));
    }
    for (int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC); fd >= 0; fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
      fillers_.push_back(fd);
      if (fd > highest) break;
    }
    rlimit limited = saved_;
    limited.rlim_cur = static_cast<rlim_t>(fillers_.back() + 1 + more);
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &limited), 0);
  }
  ~DescriptorLimit() {
    ::setrlimit(RLIMIT_NOFILE, &saved_);
    for (int fd : fillers_) ::close(fd);
  }

 private:
  rlimit saved_{};
  std::vector<int> fillers_;
};

bool any_damaged(const std::string& run_dir) {
  for (const std::string& name : folder_entries(run_dir)) {
    if (name.find(".damaged") != std::string::npos) return true;
  }
  return false;
}

// The search of a checkpoint of 16 ranks needs one descriptor: it reads the rank files one after the other.
TEST(ShardedCheckpointScale, TheSearchHoldsOneRankFileOpenAtATime) {
  const std::string run_dir = make_temp_dir("sharded_scale_descriptors");
  const std::string path = write_checkpoint(make_world(16), run_dir);
  std::optional<std::string> found;
  {
    DescriptorLimit one_more(1);
    found = find_latest_intact_checkpoint(run_dir);
  }
  EXPECT_EQ(found, path);
  EXPECT_FALSE(any_damaged(run_dir));
}

// A run dir or a checkpoint that cannot be opened for want of a descriptor is neither empty nor damaged: the
// search stops in one line saying why, and sets nothing aside (the older checkpoint would otherwise be continued
// in the newest one's place, or none, and the run would start over).
TEST(ShardedCheckpointScale, AnOpenThatFailsForWantOfDescriptorsIsNotDamage) {
  const std::string run_dir = make_temp_dir("sharded_scale_emfile");
  const auto ranks = make_world(4);
  const std::string newest = write_checkpoint(ranks, run_dir);
  std::ofstream(checkpoint_path(run_dir, 0, 3)) << "an older checkpoint";
  const auto expect_not_damage = [](const std::function<void()>& look, const std::string& names) {
    try {
      look();
      ADD_FAILURE() << "went on without reading " << names;
    } catch (const InvalidArgument& wrong) {
      ADD_FAILURE() << "taken for damage: " << wrong.what();
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(names), std::string::npos) << message;
      EXPECT_NE(message.find("Too many open files"), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  };
  {
    DescriptorLimit none(0);
    expect_not_damage([&] { find_latest_intact_checkpoint(run_dir); }, run_dir);
    expect_not_damage([&] { checkpoint_damage(newest); }, newest + ": cannot open safetensors file");
  }
  EXPECT_FALSE(any_damaged(run_dir));
  EXPECT_EQ(find_latest_intact_checkpoint(run_dir), newest) << "with descriptors to spare it is intact";
}

// The checkpoint file again, with the index rewritten by `edit` (and its checksum brought up to date), as a
// writer that is not tandem might leave it: every checksum matches.
void rewrite_index(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string index_path = fs::path(path).parent_path().string() + "/" + index_file_name(path);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  edit(index);
  ShardedIndex parsed;
  parsed.world_size = index.at("world_size").get<int>();
  parsed.files = index.at("files").get<std::vector<std::string>>();
  for (const auto& unit : index.at("units")) parsed.units.push_back({unit.at("name"), unit.at("numel"), unit.at("padded_numel")});
  for (const auto& tensor : index.at("tensors")) {
    ShardedTensor t{tensor.at("name"), tensor.at("shape").get<std::vector<int64_t>>(), tensor.at("dtype"), tensor.at("unit"), {}};
    for (const auto& piece : tensor.at("pieces")) {
      t.pieces.push_back({piece.at("file"), piece.at("tensor_range").at(0), piece.at("tensor_range").at(1),
                          piece.at("unit_range").at(0), piece.at("unit_range").at(1)});
    }
    parsed.tensors.push_back(std::move(t));
  }
  const std::map<std::string, std::string> recorded = write_index(path, parsed);
  TensorFile file = load_safetensors(path);
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {
    it = it->first.rfind("crc32c.", 0) == 0 ? file.metadata.erase(it) : std::next(it);
  }
  for (const auto& [key, value] : recorded) file.metadata[key] = value;
  save_checksummed(path, file.tensors, file.metadata);
}

// Pieces of the same length that overlap cover as many elements as the tensor has, and match the entries of the
// rank files: before the index was checked, the elements they leave out were never written, and the run went on
// with whatever memory held there.
TEST(ShardedCheckpointScale, AnIndexWhosePiecesOverlapIsDamageNamingIt) {
  const std::string run_dir = make_temp_dir("sharded_scale_overlap");
  const auto ranks = make_world(2);
  const std::string path = write_checkpoint(ranks, run_dir);
  rewrite_index(path, [](nlohmann::json& index) {
    for (auto& tensor : index.at("tensors")) {
      auto& pieces = tensor.at("pieces");
      if (pieces.size() != 2) continue;
      // [0, a) and [a, n) become [0, a) and [a - d, n - d): same lengths, the last d elements unread.
      const int64_t shift = 1;
      for (const char* range : {"tensor_range", "unit_range"}) {
        pieces[1][range][0] = pieces[1][range][0].get<int64_t>() - shift;
        pieces[1][range][1] = pieces[1][range][1].get<int64_t>() - shift;
      }
      return;
    }
  });
  const std::string index = run_dir + "/" + index_file_name(path);
  try {
    load_fsdp_sharded_checkpoint(path, *ranks[1]->sharded, *ranks[1]->module, *ranks[1]->optimizer, nullptr);
    ADD_FAILURE() << "loaded pieces that leave elements unread";
  } catch (const InvalidArgument& damaged) {
    const std::string message = damaged.what();
    EXPECT_NE(message.find(index + ": the piece"), std::string::npos) << message;
    EXPECT_NE(message.find("overlaps another, leaves a gap"), std::string::npos) << message;
    EXPECT_NE(message.find("(the index is damaged)"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(checkpoint_damage(path).find(index + ": the piece"), std::string::npos) << "the search sets it aside";
}

}  // namespace
}  // namespace tandem::checkpoint::sharded_checkpoint_scale
