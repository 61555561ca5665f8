// The reducer's bookkeeping (which ranks trained, which failed) must come through any comm hook exactly. A
// 16-bit hook that rounded it would make the reducer count fewer trained ranks than the world holds and scale
// every gradient by world / counted (+2.1% at 48 ranks with bf16), silently. Threads of one process meet on an
// in-memory fabric instead of sockets, so every world size from 2 to 128 is cheap to try.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp_fixtures.h"
#include "tandem/comm/communicator.h"
#include "tandem/ddp/comm_hook.h"

namespace tandem::testing {
namespace {

class FinishedWork : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
  void observe_completion(std::function<void()> observer) override { observer(); }
};

// The ranks' meeting point in one process: each collective waits for every rank's contribution, and the last to
// arrive combines them, in rank order. A sum adds them one at a time in the tensor's own dtype, rounding after
// each addition, as a reduction over the ranks does.
class Fabric {
 public:
  explicit Fabric(int world) : world_(world), contributions_(world) {}

  torch::Tensor exchange(int rank, const torch::Tensor& mine,
                         const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& combine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    contributions_[rank] = mine.clone();
    if (++arrived_ == world_) {
      result_ = combine(contributions_);
      arrived_ = 0;
      ++round_;
      all_arrived_.notify_all();
    } else if (!all_arrived_.wait_for(lock, std::chrono::seconds(30), [&] { return round_ != round; })) {
      throw std::runtime_error("rank " + std::to_string(rank) + " waited 30 s for the others to reach a collective");
    }
    return result_;  // not replaced before every rank has read it: the next round needs this rank too
  }

 private:
  const int world_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  std::vector<torch::Tensor> contributions_;
  torch::Tensor result_;
  int arrived_ = 0;
  uint64_t round_ = 0;
};

// One rank on a Fabric; every collective blocks until all ranks issued it, which the reducer's fixed order allows.
class FabricRank : public comm::Communicator {
 public:
  FabricRank(Fabric& fabric, const comm::StorePtr& store, int rank, int world)
      : Communicator("fabric", store, rank, world, std::chrono::seconds(30), Capabilities{}), fabric_(fabric) {}

 protected:
  comm::WorkPtr start_all_reduce(torch::Tensor& tensor, comm::ReduceOp op) override {
    EXPECT_EQ(op, comm::ReduceOp::Sum) << "the base turns an average into a sum";
    tensor.copy_(fabric_.exchange(rank(), tensor, [](const std::vector<torch::Tensor>& all) {
      torch::Tensor sum = all[0].clone();
      for (size_t r = 1; r < all.size(); ++r) sum.add_(all[r]);
      return sum;
    }));
    return std::make_shared<FinishedWork>();
  }
  comm::WorkPtr start_broadcast(torch::Tensor& tensor, int root) override {
    tensor.copy_(fabric_.exchange(rank(), tensor, [root](const std::vector<torch::Tensor>& all) { return all[root]; }));
    return std::make_shared<FinishedWork>();
  }
  comm::WorkPtr start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override {
    const torch::Tensor all = fabric_.exchange(rank(), input, [](const std::vector<torch::Tensor>& each) {
      return torch::stack(each);
    });
    for (size_t r = 0; r < outputs.size(); ++r) outputs[r].copy_(all[r].view(outputs[r].sizes()));
    return std::make_shared<FinishedWork>();
  }
  comm::WorkPtr start_barrier() override {
    fabric_.exchange(rank(), torch::zeros({1}), [](const std::vector<torch::Tensor>& all) { return all[0]; });
    return std::make_shared<FinishedWork>();
  }

 private:
  Fabric& fabric_;
};

// What `hook` makes of one gradient that every rank holds: every rank trained, so the reducer must hand this
// back unchanged, with nothing of its own mixed in. Collective.
torch::Tensor hook_mean(ddp::CommHook& hook, comm::Communicator& communicator, const torch::Tensor& gradient) {
  torch::Tensor buffer = gradient.flatten().clone();
  hook.launch(communicator, {0, 1, buffer, {buffer}})->wait();
  return buffer.view(gradient.sizes());
}

TEST(ReducerBookkeeping, TheHooksMeanReachesGradUnchangedAtEveryWorldSize) {
  // The plain average carries the bookkeeping in its float32 bucket, which no world size rounds; a few suffice.
  struct Hook {
    std::string name;
    ddp::CommHookPtr (*make)();
    std::vector<int> worlds;
  };
  std::vector<int> every_world;
  for (int world = 2; world <= 128; ++world) every_world.push_back(world);
  const std::vector<Hook> hooks = {{"bf16", &ddp::make_bf16_compress_hook, every_world},
                                   {"fp16", &ddp::make_fp16_compress_hook, every_world},
                                   {"average", &ddp::make_average_hook, {2, 3, 48, 128}}};
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({5, 6}), target = torch::randn({5, 3});
  const torch::nn::Linear initial(6, 3);
  std::mutex wrong_mutex;
  std::vector<std::string> wrong;
  for (const Hook& hook : hooks) {
    for (const int world : hook.worlds) {
      Fabric fabric(world);
      const comm::StorePtr store = c10::make_intrusive<c10d::HashStore>();
      std::vector<std::thread> ranks;
      std::atomic<bool> reported{false};
      for (int rank = 0; rank < world; ++rank) {
        ranks.emplace_back([&, rank] {
          const std::string& name = hook.name;
          try {
            FabricRank communicator(fabric, store, rank, world);
            torch::nn::Linear replica(6, 3);
            {
              torch::NoGradGuard no_grad;
              for (size_t i = 0; i < replica->parameters().size(); ++i) replica->parameters()[i].copy_(initial->parameters()[i]);
            }
            torch::nn::Linear local = std::dynamic_pointer_cast<torch::nn::LinearImpl>(replica->clone());
            torch::mse_loss(local(x), target).backward();
            ddp::DdpOptions options;
            options.comm_hook = hook.make();
            ddp::DistributedDataParallel<torch::nn::Linear> model(replica, borrow(communicator), options);
            torch::mse_loss(model(x), target).backward();
            for (size_t i = 0; i < replica->parameters().size(); ++i) {
              const torch::Tensor want = hook_mean(*options.comm_hook, communicator, local->parameters()[i].grad());
              const torch::Tensor got = replica->parameters()[i].grad();
              if (!torch::equal(got, want) && !reported.exchange(true)) {
                const double ratio = (got / want).nan_to_num(1.0).max().item<double>();
                std::lock_guard<std::mutex> lock(wrong_mutex);
                wrong.push_back(name + " at " + std::to_string(world) + " ranks (x" + std::to_string(ratio) + ")");
              }
            }
          } catch (const std::exception& error) {
            std::lock_guard<std::mutex> lock(wrong_mutex);
            wrong.push_back(name + " at " + std::to_string(world) + " ranks: " + error.what());
          }
        });
      }
      for (auto& rank : ranks) rank.join();
    }
  }
  EXPECT_TRUE(wrong.empty()) << "the reducer changed what the hook averaged: " << ::testing::PrintToString(wrong);
}

}  // namespace
}  // namespace tandem::testing
