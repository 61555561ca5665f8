// In-job recovery's membership protocol (docs/recovery.md) without processes: the launcher's side
// (src/launch/in_job_recovery.h) and the workers' (comm/membership.h) over one in-memory store, the workers'
// communicators real Gloo ones between threads; and its shape at scale, with hundreds of workers.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <future>
#include <thread>

#include "src/launch/in_job_recovery.h"
#include "tandem/comm/counting_store.h"
#include "tandem/comm/gloo/gloo_communicator.h"
#include "tandem/comm/membership.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

using comm::Membership;
using launch::InJobRecovery;

constexpr std::chrono::seconds kTimeout{20};

Membership::Connect gloo_connect() {
  return [](const comm::StorePtr& store, int rank, int world) {
    return std::make_shared<comm::GlooCommunicator>(store, rank, world, kTimeout);
  };
}

// Forms epoch 0's communicators of `slots` workers (as init_process_group does) and their memberships.
std::vector<std::unique_ptr<Membership>> first_members(const comm::StorePtr& store, int slots) {
  std::vector<std::future<comm::CommunicatorPtr>> connecting;
  const comm::StorePtr epoch0 = c10::make_intrusive<c10d::PrefixStore>("epoch0/", store);
  for (int slot = 0; slot < slots; ++slot) {
    connecting.push_back(std::async(std::launch::async, [&, slot] { return gloo_connect()(epoch0, slot, slots); }));
  }
  std::vector<std::unique_ptr<Membership>> members;
  for (int slot = 0; slot < slots; ++slot) {
    members.push_back(std::make_unique<Membership>(store, slot, slots, gloo_connect(), connecting[slot].get(), kTimeout));
  }
  return members;
}

// Each of `members` advances to the launcher's next epoch and all-reduces a 1 over its communicator; returns what
// each got.
std::vector<float> advance_and_count(const std::vector<Membership*>& members) {
  std::vector<std::future<float>> counts;
  for (Membership* member : members) {
    counts.push_back(std::async(std::launch::async, [member] {
      member->advance();
      torch::Tensor one = torch::ones({1});
      member->communicator()->all_reduce(one)->wait();
      return one.item<float>();
    }));
  }
  std::vector<float> got;
  for (auto& count : counts) got.push_back(count.get());
  return got;
}

TEST(MembershipProtocol, ALostSlotLeavesTheOthersOnANewGroupAndItsReplacementJoinsThemAgain) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto workers = first_members(store, 3);
  InJobRecovery launcher(store, 3, /*replacements_allowed=*/1);

  const InJobRecovery::Loss loss = launcher.lose(1, /*exit_code=*/-1, /*members_running=*/2);
  EXPECT_TRUE(loss.recovered);
  EXPECT_TRUE(loss.replace);
  EXPECT_EQ(workers[0]->published(), 1);
  EXPECT_EQ(advance_and_count({workers[0].get(), workers[2].get()}), (std::vector<float>{2, 2}));
  EXPECT_EQ(workers[2]->communicator()->rank(), 1) << "ranks are the members' places among the slots";

  // The replacement holds no group until it is taken in, and waits through the epochs without it.
  Membership replacement(store, 1, 3, gloo_connect(), nullptr, kTimeout);
  EXPECT_FALSE(replacement.joined());
  EXPECT_TRUE(launcher.take_in_ready().empty()) << "not ready yet";
  replacement.announce_ready();
  EXPECT_EQ(launcher.take_in_ready(), std::vector<int>{1});
  EXPECT_TRUE(launcher.joined().empty()) << "published, but not formed with the others yet";
  EXPECT_TRUE(launcher.needs_polling());
  EXPECT_EQ(advance_and_count({workers[0].get(), &replacement, workers[2].get()}), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(launcher.joined(), std::vector<int>{1});
  EXPECT_FALSE(launcher.needs_polling());
  EXPECT_EQ(replacement.epoch(), 2);
  EXPECT_EQ(replacement.communicator()->rank(), 1);
}

// A collective that waits on a lost slot is abandoned by the watcher, not left to the timeout, even where the
// slot's replacement was taken in before the watcher looked: an epoch in between left the slot out.
TEST(MembershipProtocol, AWaitOnALostSlotIsAbandonedEvenAfterItsReplacementWasTakenIn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto workers = first_members(store, 3);
  InJobRecovery launcher(store, 3, 1);
  launcher.lose(1, -1, 2);
  store->set(comm::MembershipKeys::ready(1), {'1'});
  ASSERT_EQ(launcher.take_in_ready(), std::vector<int>{1});
  // Slots 0 and 2 all-reduce on epoch 0's group, which slot 1's lost process never joins.
  std::vector<std::future<std::string>> waits;
  for (int slot : {0, 2}) {
    waits.push_back(std::async(std::launch::async, [&, slot] {
      torch::Tensor one = torch::ones({1});
      try {
        workers[slot]->communicator()->all_reduce(one)->wait();
        return std::string("completed");
      } catch (const CommError& error) {
        return std::string(error.what());
      }
    }));
  }
  for (auto& wait : waits) {
    const std::string outcome = wait.get();
    EXPECT_NE(outcome.find("abandoned: the job's membership changed"), std::string::npos) << outcome;
  }
}

TEST(MembershipProtocol, WhatCannotBeRecoveredInTheJobIsLeftToTheLauncherAsBefore) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  InJobRecovery launcher(store, 4, /*replacements_allowed=*/1);
  EXPECT_FALSE(launcher.lose(0, -1, 3).recovered) << "slot 0 writes the records and checkpoints";
  EXPECT_FALSE(launcher.lose(2, 2, 3).recovered) << "exit code 2 refused its input, as every rank will";
  EXPECT_FALSE(launcher.lose(3, -1, 0).recovered) << "no member left to go on";
  EXPECT_EQ(launcher.epoch(), 0) << "nothing published";

  // A replacement lost before it was taken in changes no membership; with no restart left, none follows it.
  EXPECT_TRUE(launcher.lose(1, -1, 3).replace);
  EXPECT_EQ(launcher.epoch(), 1);
  const InJobRecovery::Loss again = launcher.lose(1, -1, 3);
  EXPECT_TRUE(again.recovered);
  EXPECT_FALSE(again.replace);
  EXPECT_EQ(launcher.epoch(), 1);
  EXPECT_FALSE(launcher.needs_polling());
}

// The members close the run after their last step: a replacement not taken in by then ends by itself, whether it
// still waits for its epoch or was published in one that nobody else will form.
TEST(MembershipProtocol, AReplacementThatTheMembersEndedTheRunWithoutEndsByItself) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto workers = first_members(store, 2);
  InJobRecovery launcher(store, 2, /*replacements_allowed=*/2);
  ASSERT_TRUE(launcher.lose(1, -1, 1).replace);
  workers[0]->advance();
  Membership waiting(store, 1, 2, gloo_connect(), nullptr, kTimeout);
  auto advanced = std::async(std::launch::async, [&] { return waiting.advance(); });
  EXPECT_EQ(advanced.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout) << "no epoch yet";
  workers[0]->close();
  EXPECT_FALSE(advanced.get());
  EXPECT_FALSE(waiting.joined());

  // Published in an epoch with slot 0, which closed the run instead of forming it.
  auto others = first_members(c10::make_intrusive<c10d::PrefixStore>("second/", store), 2);
  InJobRecovery second(c10::make_intrusive<c10d::PrefixStore>("second/", store), 2, 2);
  second.lose(1, -1, 1);
  others[0]->advance();
  Membership published(c10::make_intrusive<c10d::PrefixStore>("second/", store), 1, 2, gloo_connect(), nullptr,
                       kTimeout);
  published.announce_ready();
  ASSERT_EQ(second.take_in_ready(), std::vector<int>{1});
  others[0]->close();
  EXPECT_FALSE(published.advance());
}

// Across nodes (an elastic job): the deciding launcher publishes what the others report, a node's loss included,
// and every node's replacements count against the job's --max-restarts.
TEST(MembershipProtocol, AcrossNodesTheDecidingLauncherPublishesWhatTheOthersReport) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Three nodes of two workers: slots 0-1 decide, 2-3 and 4-5 report.
  InJobRecovery decides(store, 6, {0, 2, true}, /*replacements_allowed=*/1);
  InJobRecovery second(store, 6, {2, 2, false}, 1);
  InJobRecovery third(store, 6, {4, 2, false}, 1);
  EXPECT_TRUE(decides.needs_polling()) << "the other nodes may report at any time";
  EXPECT_FALSE(second.needs_polling()) << "a reporting node polls nothing";

  const InJobRecovery::Loss lost = second.lose(3, -1, 1);
  EXPECT_TRUE(lost.recovered);
  EXPECT_TRUE(lost.replace);
  EXPECT_EQ(lost.replacements_used, 1);
  EXPECT_EQ(decides.epoch(), 0) << "not read yet";
  EXPECT_TRUE(decides.take_in_ready().empty());
  EXPECT_EQ(decides.epoch(), 1);
  EXPECT_EQ(comm::store_text(store->get(comm::MembershipKeys::members(1))), "0,1,2,4,5");

  const InJobRecovery::Loss no_restart_left = third.lose(4, -1, 1);
  EXPECT_TRUE(no_restart_left.recovered);
  EXPECT_FALSE(no_restart_left.replace) << "the job's one restart went to slot 3";
  EXPECT_FALSE(third.lose(0, -1, 1).recovered) << "slot 0 is never recovered in the job";

  // Node 1 (slots 2 and 3) is lost as a whole; slot 3's replacement never came. Its slots await a node.
  InJobRecovery::report_node_lost(store, 2, 2);
  decides.take_in_ready();
  EXPECT_EQ(comm::store_text(store->get(comm::MembershipKeys::members(decides.epoch()))), "0,1,5");
  store->set(comm::MembershipKeys::ready(2), {'1'});
  store->set(comm::MembershipKeys::ready(3), {'1'});
  EXPECT_EQ(decides.take_in_ready(), (std::vector<int>{2, 3})) << "a node that comes takes its place";
  EXPECT_EQ(comm::store_text(store->get(comm::MembershipKeys::members(decides.epoch()))), "0,1,2,3,5");
}

TEST(MembershipProtocol, AWorkerLeftOutOfTheNewEpochSaysItWasCountedLost) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto workers = first_members(store, 2);
  InJobRecovery launcher(store, 2, 0);
  launcher.lose(1, 1, 1);
  try {
    workers[1]->advance();
    FAIL() << "slot 1 is no member of epoch 1";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("left slot 1 out of membership epoch 1 (0)"), std::string::npos)
        << error.what();
  }
}

// The control plane's shape at scale: with 256 workers, a loss and a replacement's join cost the member that arrives
// last at the new epoch about ten store requests (9 here: the epoch's wait, the newest epoch, its members, its
// arrival and fate), whatever the number of workers, and the launcher two writes an epoch.
TEST(MembershipProtocol, EachMemberSpendsAFewStoreRequestsPerChangeWhateverTheWorldSize) {
  constexpr int kSlots = 256;
  auto shared = c10::make_intrusive<c10d::HashStore>();
  auto launcher_store = c10::make_intrusive<comm::CountingStore>(shared);
  InJobRecovery launcher(launcher_store, kSlots, 1);
  // The communicators are not what is measured: each epoch's is a stand-in that records its rank and size.
  struct StandIn : comm::Communicator {
    StandIn(comm::StorePtr store, int rank, int world)
        : Communicator("stand-in", std::move(store), rank, world, kTimeout, Capabilities{}) {}
    comm::WorkPtr start_all_reduce(torch::Tensor&, comm::ReduceOp) override { return nullptr; }
    comm::WorkPtr start_broadcast(torch::Tensor&, int) override { return nullptr; }
    comm::WorkPtr start_all_gather(std::vector<torch::Tensor>&, const torch::Tensor&) override { return nullptr; }
    comm::WorkPtr start_barrier() override { return nullptr; }
  };
  const Membership::Connect stand_in = [](const comm::StorePtr& store, int rank, int world) {
    return std::make_shared<StandIn>(store, rank, world);
  };
  std::vector<c10::intrusive_ptr<comm::CountingStore>> stores;
  std::vector<std::unique_ptr<Membership>> members;
  const auto first = std::make_shared<StandIn>(shared, 0, kSlots);
  for (int slot = 0; slot < kSlots; ++slot) {
    stores.push_back(c10::make_intrusive<comm::CountingStore>(shared));
    // No watcher: its reads, one a watch interval, would be counted with the change's.
    members.push_back(
        std::make_unique<Membership>(stores.back(), slot, kSlots, stand_in, first, kTimeout, std::chrono::hours(1)));
  }
  launcher.lose(77, -1, kSlots - 1);
  Membership replacement(c10::make_intrusive<comm::CountingStore>(shared), 77, kSlots, stand_in, nullptr, kTimeout,
                         std::chrono::hours(1));
  replacement.announce_ready();
  ASSERT_EQ(launcher.take_in_ready(), std::vector<int>{77});
  // Every member but slot 0 (and the replacement) advances on a thread of its own and waits for the others to
  // arrive; slot 0 arrives last, and its requests are counted: they do not depend on how long the others waited.
  std::vector<std::thread> others;
  for (int slot = 1; slot < kSlots; ++slot) {
    if (slot != 77) others.emplace_back([&, slot] { members[slot]->advance(); });
  }
  others.emplace_back([&] { replacement.advance(); });
  while (shared->add(comm::MembershipKeys::arrivals(2), 0) < kSlots - 1) std::this_thread::yield();
  const comm::StoreTraffic before = stores[0]->traffic();
  members[0]->advance();
  const int64_t operations = stores[0]->traffic().since(before).operations;
  for (auto& thread : others) thread.join();
  EXPECT_LE(operations, 10) << "the last member to arrive";
  for (int slot = 0; slot < kSlots; ++slot) {
    const Membership& member = slot == 77 ? replacement : *members[slot];
    EXPECT_EQ(member.epoch(), 2) << "slot " << slot;
    EXPECT_EQ(member.communicator()->world_size(), kSlots);
    EXPECT_EQ(member.communicator()->rank(), slot);
  }
  // Two epochs (the loss, the join): the members' list and the epoch's number each; the readiness checked and
  // taken back; the replacement counted against --max-restarts.
  EXPECT_LE(launcher_store->traffic().writes, 2 * 2 + 3);
}

}  // namespace
}  // namespace tandem::testing
