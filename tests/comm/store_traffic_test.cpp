// What the rendezvous store sees while ranks train: nothing per collective and nothing per training step (issue
// 41: on LibTorch 1.13 the collective tracker appended its progress and signatures to the workers' FileStore
// every 200 ms, about 22 KB/s for two ranks, gigabytes a day). Each rank reaches the shared store through a
// CountingStore; the only traffic left is the tracker's poll for a failure to diagnose, one read per rank per
// CollectiveTracker::kPoll, which writes nothing and depends on neither the collectives, the steps nor the world
// size.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <thread>

#include "ddp/ddp_fixtures.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/comm/collective_tracker.h"
#include "tandem/comm/counting_store.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

namespace tandem {
namespace {

using comm::CollectiveTracker;
using comm::CountingStore;
using comm::StoreTraffic;
using namespace std::chrono_literals;

// One CountingStore per rank over `shared`.
std::vector<c10::intrusive_ptr<CountingStore>> counting_stores(const comm::StorePtr& shared, int world_size) {
  std::vector<c10::intrusive_ptr<CountingStore>> stores;
  for (int rank = 0; rank < world_size; ++rank) stores.push_back(c10::make_intrusive<CountingStore>(shared));
  return stores;
}

// Waits (bounded) until `store` has seen `operations` more operations than `since` from this rank's background
// threads: the tracker's polls, which come by the clock. A tracker that wrote by the clock would have written as
// often in the same time.
void wait_for_background_operations(const CountingStore& store, const StoreTraffic& since, int64_t operations) {
  const auto give_up = std::chrono::steady_clock::now() + 10 * CollectiveTracker::kPoll;
  while (store.traffic().since(since).operations < operations) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the tracker never polled the store";
    std::this_thread::sleep_for(10ms);
  }
}

void all_reduce_times(comm::Communicator& communicator, int times) {
  torch::Tensor values = torch::ones({16});
  for (int i = 0; i < times; ++i) communicator.all_reduce(values, comm::ReduceOp::Sum)->wait();
}

TEST(StoreTraffic, AFileStoreDoesNotGrowWithTheCollectivesOrTheTime) {
  testing::ScratchDir scratch;
  const std::string path = scratch / "store";
  const int world_size = 2;
  auto stores = counting_stores(c10::make_intrusive<c10d::FileStore>(path, world_size), world_size);
  std::vector<std::uintmax_t> file_bytes;  // after the connect, after 10 collectives, after 100
  std::vector<StoreTraffic> tracker_traffic(world_size);
  testing::run_thread_ranks_on(
      [&](int rank) { return stores[rank]; }, world_size, [&](int rank, comm::Communicator& communicator) {
        all_reduce_times(communicator, 1);  // both ranks connected, whatever they wrote for it written
        const StoreTraffic connected = stores[rank]->traffic();
        for (int collectives : {0, 10, 90}) {
          all_reduce_times(communicator, collectives);
          // Two polls of this rank: time in which a periodic writer would have written too.
          const StoreTraffic before_polls = stores[rank]->traffic();
          wait_for_background_operations(*stores[rank], before_polls, 2);
          all_reduce_times(communicator, 1);  // the other rank has waited as long
          if (rank == 0) file_bytes.push_back(std::filesystem::file_size(path));
          all_reduce_times(communicator, 1);  // rank 1 writes nothing before rank 0 has looked
        }
        tracker_traffic[rank] = stores[rank]->traffic().since(connected);
      });
  ASSERT_EQ(file_bytes.size(), 3u);
  std::printf("[store traffic] FileStore bytes after the connect, 10 and 100 collectives: %ju, %ju, %ju\n",
              file_bytes[0], file_bytes[1], file_bytes[2]);
  EXPECT_EQ(file_bytes[1], file_bytes[0]) << "10 collectives grew the store";
  EXPECT_EQ(file_bytes[2], file_bytes[0]) << "100 collectives grew the store";
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_EQ(tracker_traffic[rank].writes, 0) << "rank " << rank;
    EXPECT_EQ(tracker_traffic[rank].bytes_received, 0) << "rank " << rank << " read values back";
  }
}

// Trains `steps` steps of a small MLP under DDP or FSDP on every rank and returns each rank's store traffic
// during those steps alone, with the seconds they took on the slowest rank.
struct StepTraffic {
  std::vector<StoreTraffic> per_rank;
  double seconds = 0;
};

StepTraffic traffic_of_steps(const std::string& strategy, int world_size, int steps) {
  auto stores = counting_stores(c10::make_intrusive<c10d::HashStore>(), world_size);
  StepTraffic result;
  result.per_rank.resize(world_size);
  std::vector<double> seconds(world_size);
  testing::run_thread_ranks_on(
      [&](int rank) { return stores[rank]; }, world_size, [&](int rank, comm::Communicator& communicator) {
        torch::manual_seed(0);
        testing::Net net(32, false);
        auto train = [&](auto& model) {
          torch::optim::SGD optimizer(model.parameters(), 0.1);
          torch::Tensor x = torch::randn({4, 8});
          torch::Tensor y = torch::randn({4, 4});
          const StoreTraffic before = stores[rank]->traffic();
          const auto start = std::chrono::steady_clock::now();
          for (int step = 0; step < steps; ++step) {
            optimizer.zero_grad();
            torch::mse_loss(model(x), y).backward();
            optimizer.step();
          }
          seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          result.per_rank[rank] = stores[rank]->traffic().since(before);
        };
        if (strategy == "ddp") {
          ddp::DistributedDataParallel<testing::Net> model(net, testing::borrow(communicator));
          train(model);
        } else {
          fsdp::FullyShardedDataParallel<testing::Net> model(net, testing::borrow(communicator));
          train(model);
        }
      });
  result.seconds = *std::max_element(seconds.begin(), seconds.end());
  return result;
}

TEST(StoreTraffic, ATrainingStepMakesNoStoreOperationUnderDdpOrFsdp) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    for (int world_size : {2, 3}) {
      for (int steps : {5, 50}) {
        const StepTraffic traffic = traffic_of_steps(strategy, world_size, steps);
        // The tracker's poll, by the clock: at most one per kPoll begun, whatever the steps did.
        const int64_t polls = 1 + static_cast<int64_t>(traffic.seconds * 1000 / CollectiveTracker::kPoll.count());
        for (int rank = 0; rank < world_size; ++rank) {
          const StoreTraffic& t = traffic.per_rank[rank];
          std::printf("[store traffic] %s world %d rank %d, %d steps in %.2f s: %lld operations (%lld writes), "
                      "%lld bytes sent, %lld received\n",
                      strategy.c_str(), world_size, rank, steps, traffic.seconds, static_cast<long long>(t.operations),
                      static_cast<long long>(t.writes), static_cast<long long>(t.bytes_sent),
                      static_cast<long long>(t.bytes_received));
          const std::string where = strategy + " world " + std::to_string(world_size) + " rank " +
                                    std::to_string(rank) + ", " + std::to_string(steps) + " steps";
          EXPECT_EQ(t.writes, 0) << where;
          EXPECT_EQ(t.bytes_received, 0) << where;
          EXPECT_LE(t.operations, polls) << where << ": more than the tracker's poll";
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
