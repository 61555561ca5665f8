// The elastic agents' rounds (round_rendezvous.h), several agents in one process over one c10d store, on a clock
// the test moves: who gets which node rank, when a round closes, what ends it and what counts as a failure.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <memory>
#include <vector>

#include "tandem/launch/round_rendezvous.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

using namespace std::chrono_literals;
using Clock = RoundRendezvous::Clock;

ElasticSettings settings(int min_nodes, int max_nodes) {
  ElasticSettings result;
  result.min_nodes = min_nodes;
  result.max_nodes = max_nodes;
  result.host = "127.0.0.1";
  result.join_timeout = 60s;
  result.last_call = 2s;
  result.keep_alive_interval = 1s;
  result.keep_alive_max_attempt = 3;
  return result;
}

struct Agents {
  explicit Agents(ElasticSettings job) : job_settings(std::move(job)) {}

  RoundRendezvous& add(const std::string& nproc = "1") {
    agents.push_back(std::make_unique<RoundRendezvous>(
        store, job_settings, "agent " + std::to_string(agents.size()),
        std::map<std::string, std::string>{{"`nproc_per_node`", nproc}, {"command", "train"}}));
    return *agents.back();
  }
  // Polls every agent once at `now`; returns who is in a closed round.
  std::vector<std::optional<RoundMembership>> poll(Clock::time_point now) {
    std::vector<std::optional<RoundMembership>> result;
    for (auto& agent : agents) result.push_back(agent->poll_round(now));
    return result;
  }

  // Both agents left after a change are in round `round` of two nodes, after `failures` rounds ended by one.
  static void expect_two_in(const std::vector<std::optional<RoundMembership>>& members, int round, int failures) {
    ASSERT_TRUE(members[0] && members[1]);
    EXPECT_EQ(members[0]->round, round);
    EXPECT_EQ(members[0]->nodes, 2);
    EXPECT_EQ(members[1]->nodes, 2);
    EXPECT_EQ(members[0]->failures_before, failures);
  }

  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  ElasticSettings job_settings;
  std::vector<std::unique_ptr<RoundRendezvous>> agents;
};

TEST(RoundRendezvous, ARoundClosesAtOnceWithItsMostNodesRankedInTheOrderTheyCame) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  const auto members = job.poll(t0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(members[i]) << "agent " << i;
    EXPECT_EQ(members[i]->round, 0);
    EXPECT_EQ(members[i]->node_rank, i);
    EXPECT_EQ(members[i]->nodes, 3);
    EXPECT_EQ(members[i]->failures_before, 0);
  }
}

TEST(RoundRendezvous, BelowItsMostNodesARoundClosesOnlyAfterTheLastCall) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  job.add().enter(t0);
  EXPECT_FALSE(job.poll(t0)[0]) << "one agent is below the least number of nodes";
  job.add().enter(t0 + 1s);
  auto members = job.poll(t0 + 1s);
  EXPECT_FALSE(members[0] || members[1]) << "the last call has not passed";
  members = job.poll(t0 + 2500ms);
  EXPECT_FALSE(members[0] || members[1]) << "the last call counts from the newest arrival";
  members = job.poll(t0 + 3s);
  ASSERT_TRUE(members[0] && members[1]);
  EXPECT_EQ(members[1]->nodes, 2);
}

TEST(RoundRendezvous, ALateNodeWaitsAndTheRunningRoundMakesRoomForItWithoutAFailure) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  job.add().enter(t0);
  job.add().enter(t0);
  ASSERT_TRUE(job.poll(t0 + 2s)[1]);
  RoundRendezvous& late = job.add();
  late.enter(t0 + 5s);
  // With min_nodes 2 and a last call long over, the newcomer still may not form a round alone beside the
  // running one.
  EXPECT_FALSE(late.poll_round(t0 + 20s));
  EXPECT_EQ(job.agents[0]->waiting(), 1);
  const auto end = job.agents[0]->watch(t0 + 5s);
  ASSERT_TRUE(end);
  EXPECT_FALSE(end->failure) << end->reason;
  EXPECT_NE(end->reason.find("waiting to join"), std::string::npos) << end->reason;
  EXPECT_EQ(job.agents[1]->end_round({true, "too late"}).reason, end->reason) << "the first end stands";
  for (int i = 0; i < 2; ++i) job.agents[i]->next_round(t0 + 6s);
  const auto members = job.poll(t0 + 6s);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(members[i]) << "agent " << i;
    EXPECT_EQ(members[i]->round, 1);
    EXPECT_EQ(members[i]->nodes, 3);
    EXPECT_EQ(members[i]->failures_before, 0) << "a node joining is no failure";
  }
  EXPECT_EQ(members[2]->node_rank, 0) << "the node that waited came first";
}

TEST(RoundRendezvous, ANodeWhoseHeartbeatStandsStillIsLostAndThatCountsAsAFailure) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.poll(t0);
  job.agents[2]->beat();  // it trained, then went
  for (int second = 0; second < 3; ++second) {
    for (int i = 0; i < 2; ++i) job.agents[i]->beat();
    for (int i = 0; i < 2; ++i) EXPECT_FALSE(job.agents[i]->watch(t0 + std::chrono::seconds(second))) << second;
  }
  for (int i = 0; i < 2; ++i) job.agents[i]->beat();
  const auto end = job.agents[1]->watch(t0 + 3s);
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->failure);
  EXPECT_TRUE(end->lost_node);
  EXPECT_NE(end->reason.find("node 2 (agent 2) was lost: no heartbeat for 3.0 s"), std::string::npos) << end->reason;
  for (int i = 0; i < 2; ++i) job.agents[i]->next_round(t0 + 4s);
  EXPECT_FALSE(job.agents[0]->poll_round(t0 + 4s));
  job.agents.pop_back();
  Agents::expect_two_in(job.poll(t0 + 6s), 1, 1);
}

TEST(RoundRendezvous, ANodeThatNeverBeatNeverStartedAndItsLossIsNoFailure) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.poll(t0);
  for (int second = 0; second <= 3; ++second) {
    for (int i = 0; i < 2; ++i) job.agents[i]->beat();
    if (second < 3) {
      EXPECT_FALSE(job.agents[0]->watch(t0 + std::chrono::seconds(second))) << second;
    }
  }
  const auto end = job.agents[0]->watch(t0 + 3s);
  ASSERT_TRUE(end);
  EXPECT_FALSE(end->failure) << end->reason;
  EXPECT_TRUE(end->lost_node) << "its workers may run all the same, until its agent gives up on the store";
  EXPECT_NE(end->reason.find("node 2 (agent 2) never started its round"), std::string::npos) << end->reason;
}

TEST(RoundRendezvous, ARoundAfterALostNodeClosesOnlyOnceTheLostNodesWorkersAreCertainlyStopped) {
  ElasticSettings job_settings = settings(2, 3);
  job_settings.worker_stop_time = 5s;
  Agents job(job_settings);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.poll(t0);
  for (int i = 0; i < 3; ++i) job.agents[i]->beat();
  ASSERT_FALSE(job.agents[0]->watch(t0));
  const auto end = job.agents[0]->watch(t0 + 3s);
  ASSERT_TRUE(end && end->lost_node);
  for (int i = 0; i < 2; ++i) job.agents[i]->next_round(t0 + 3s);
  job.agents.pop_back();
  // The end was seen at t0 + 3 s: the lost node's workers are gone by t0 + 8 s, whatever the last call says.
  for (auto at : {t0 + 3s, t0 + 6s, t0 + 7900ms}) {
    const auto members = job.poll(at);
    EXPECT_FALSE(members[0] || members[1]) << (at - t0).count();
  }
  Agents::expect_two_in(job.poll(t0 + 8s), 1, 1);
}

TEST(RoundRendezvous, AnAgentThatLeavesWhileWaitingGivesItsSlotBackAndOnlyLiveAgentsBecomeMembers) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.agents[0]->withdraw();
  job.agents.erase(job.agents.begin());
  auto members = job.poll(t0);
  EXPECT_FALSE(members[0] || members[1]) << "two live of three: the round waits for the last call";
  members = job.poll(t0 + 2s);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(members[i]) << "agent " << i + 1;
    EXPECT_EQ(members[i]->nodes, 2);
    EXPECT_EQ(members[i]->node_rank, i) << "node ranks count live members only";
  }
}

TEST(RoundRendezvous, AnAgentThatLeavesAsItsRoundClosesEndsThatRoundBeforeItTrainsAndCostsNoRestart) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  ASSERT_TRUE(job.agents[0]->poll_round(t0)) << "three of three: the round closes at once";
  job.agents[2]->withdraw();
  EXPECT_FALSE(job.agents[1]->poll_round(t0)) << "a member gave its slot back: this round never trains";
  const auto end = job.agents[0]->watch(t0);
  ASSERT_TRUE(end);
  EXPECT_FALSE(end->failure) << end->reason;
  EXPECT_NE(end->reason.find("node 2 (agent 2) left before its round started"), std::string::npos) << end->reason;
  job.agents[0]->next_round(t0);
  job.agents.pop_back();
  Agents::expect_two_in(job.poll(t0 + 2s), 1, 0);
}

TEST(RoundRendezvous, ASlotWhoseAgentStoppedPollingWhileWaitingIsLeftOutOfTheRound) {
  ElasticSettings job_settings = settings(2, 4);
  job_settings.last_call = 5s;
  Agents job(job_settings);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.poll(t0);
  // Agent 2 hangs (or died) from here on; its slot's heartbeat stands still from t0 on.
  std::vector<std::optional<RoundMembership>> members(2);
  for (int second = 1; second <= 5; ++second) {
    for (int i = 0; i < 2; ++i) members[i] = job.agents[i]->poll_round(t0 + std::chrono::seconds(second));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(members[i]) << "agent " << i;
    EXPECT_EQ(members[i]->nodes, 2);
  }
  EXPECT_FALSE(job.agents[2]->poll_round(t0 + 6s)) << "left out, it waits in the next round";
  EXPECT_EQ(job.agents[0]->waiting(), 1);
}

TEST(RoundRendezvous, AJobThatFinishesWhileANodeWaitsToJoinTellsTheWaitingNode) {
  Agents job(settings(2, 2));
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) job.add().enter(t0);
  job.poll(t0);
  RoundRendezvous& late = job.add();
  late.enter(t0);
  EXPECT_FALSE(late.poll_round(t0));
  EXPECT_FALSE(late.job_finished());
  for (int i = 0; i < 2; ++i) job.agents[i]->mark_succeeded();
  EXPECT_FALSE(late.poll_round(t0 + 1s));
  EXPECT_TRUE(late.job_finished());
  // Its slot given back tells the hosting agent that no one waits for the end any longer (leave()).
  EXPECT_EQ(job.agents[0]->waiting(), 0);
}

TEST(RoundRendezvous, ARunningRoundWithASucceededNodeTakesNoNewcomer) {
  Agents job(settings(1, 3));
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) job.add().enter(t0);
  job.poll(t0);
  const auto members = job.poll(t0 + 2s);
  ASSERT_TRUE(members[0] && members[1]);
  EXPECT_FALSE(job.agents[0]->mark_succeeded());
  job.add().enter(t0);
  for (int i = 0; i < 2; ++i) job.agents[i]->beat();
  EXPECT_FALSE(job.agents[1]->watch(t0)) << "the job is ending: the newcomer waits for that";
}

TEST(RoundRendezvous, TooFewNodesWithinTheJoinTimeoutIsOneLineSayingHowManyCame) {
  Agents job(settings(2, 3));
  const auto t0 = Clock::now();
  job.add().enter(t0);
  try {
    job.agents[0]->poll_round(t0 + 61s);
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("least number of nodes (2), but 1 came"), std::string::npos)
        << error.what();
  }
}

TEST(RoundRendezvous, ANodeWithOtherWorkersIsRefusedNamingBoth) {
  Agents job(settings(1, 2));
  job.add("2").enter(Clock::now());
  try {
    job.add("1").enter(Clock::now());
    FAIL() << "expected an InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("this node's `nproc_per_node` is 1, but the job's other nodes have 2"),
              std::string::npos)
        << error.what();
  }
}

TEST(RoundRendezvous, AJobIsDoneWhenEveryNodeSucceededAndRefusesANewcomer) {
  Agents job(settings(1, 2));
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) job.add().enter(t0);
  job.poll(t0);
  EXPECT_FALSE(job.agents[0]->mark_succeeded());
  EXPECT_FALSE(job.agents[0]->all_succeeded());
  EXPECT_TRUE(job.agents[1]->mark_succeeded());
  EXPECT_TRUE(job.agents[0]->all_succeeded());
  EXPECT_THROW(job.add().enter(t0), InvalidArgument);
}

// Under in-job recovery: three agents in a running round, heartbeats every second, a node lost after 3 s, its
// workers certainly stopped 2 s after. Agent 2 beats once and stops at t0.
struct InJobRound {
  InJobRound() : job(in_job_settings()) {
    for (int i = 0; i < 3; ++i) job.add().enter(t0);
    job.poll(t0);
    for (int i = 0; i < 3; ++i) job.agents[i]->beat();
    for (int i = 0; i < 2; ++i) EXPECT_FALSE(job.agents[i]->watch(t0));
  }
  static ElasticSettings in_job_settings() {
    ElasticSettings result = settings(2, 3);
    result.in_job_recovery = true;
    result.worker_stop_time = 2s;
    return result;
  }
  // Agents 0 and 1 beat and watch at `at`; nothing may end the round.
  void watch_on(Clock::time_point at) {
    for (int i = 0; i < 2; ++i) job.agents[i]->beat();
    for (int i = 0; i < 2; ++i) {
      const auto end = job.agents[i]->watch(at);
      EXPECT_FALSE(end) << "agent " << i << ": " << end->reason;
    }
  }
  const Clock::time_point t0 = Clock::now();
  Agents job;
};

TEST(RoundRendezvous, UnderInJobRecoveryALostNodeLeavesAPlaceThatANewcomerTakesWhileTheRoundRuns) {
  InJobRound round;
  round.watch_on(round.t0 + 3s);
  // One agent found it first and tells it; the other knows the place vacant and says nothing.
  auto vacated = round.job.agents[0]->take_vacated();
  const auto others = round.job.agents[1]->take_vacated();
  ASSERT_EQ(vacated.size() + others.size(), 1u);
  if (vacated.empty()) vacated = others;
  EXPECT_EQ(vacated[0].first, 2);
  EXPECT_NE(vacated[0].second.find("node 2 (agent 2) was lost: no heartbeat for 3.0 s"), std::string::npos)
      << vacated[0].second;

  RoundRendezvous& newcomer = round.job.add();
  newcomer.enter(round.t0 + 3s);
  EXPECT_FALSE(newcomer.poll_round(round.t0 + 3s)) << "the lost node's workers may still run";
  EXPECT_FALSE(newcomer.poll_round(round.t0 + 4900ms));
  const auto taken = newcomer.poll_round(round.t0 + 5s);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->round, 0) << "the running round";
  EXPECT_EQ(taken->node_rank, 2);
  EXPECT_EQ(taken->nodes, 3);
  EXPECT_TRUE(taken->replacing);
  EXPECT_EQ(round.job.agents[0]->waiting(), 0) << "its slot in the next round was given back";
  // The others watch the newcomer's heartbeat from now on, and the job is done once the three places succeeded.
  for (auto at : {round.t0 + 6s, round.t0 + 7s}) {
    newcomer.beat();
    round.watch_on(at);
  }
  EXPECT_TRUE(round.job.agents[0]->take_vacated().empty());
  EXPECT_FALSE(round.job.agents[0]->mark_succeeded());
  EXPECT_FALSE(round.job.agents[1]->mark_succeeded());
  EXPECT_TRUE(newcomer.mark_succeeded());
}

TEST(RoundRendezvous, UnderInJobRecoveryTheJobIsDoneWhenEveryPlaceStillHeldSucceeded) {
  InJobRound round;
  round.watch_on(round.t0 + 3s);
  EXPECT_FALSE(round.job.agents[0]->mark_succeeded());
  EXPECT_TRUE(round.job.agents[1]->mark_succeeded()) << "nobody holds the lost node's place";
}

TEST(RoundRendezvous, UnderInJobRecoveryANodeTheOthersTookForLostStopsAndTakesItsPlaceAgain) {
  InJobRound round;
  round.watch_on(round.t0 + 3s);
  RoundRendezvous& slow = *round.job.agents[2];
  slow.beat();
  const auto end = slow.watch(round.t0 + 3s);
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->this_node_lost);
  EXPECT_FALSE(end->failure);
  EXPECT_NE(end->reason.find("the other nodes took node 2 (agent 2) for lost"), std::string::npos) << end->reason;
  round.watch_on(round.t0 + 3500ms);
  slow.next_round(round.t0 + 4s);
  EXPECT_FALSE(slow.poll_round(round.t0 + 4s)) << "its workers are stopped within worker_stop_time of its sight";
  const auto taken = slow.poll_round(round.t0 + 6s);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->round, 0);
  EXPECT_EQ(taken->node_rank, 2);
  EXPECT_TRUE(taken->replacing);
}

TEST(RoundRendezvous, UnderInJobRecoveryLosingRankZerosNodeStillEndsTheRound) {
  ElasticSettings job_settings = InJobRound::in_job_settings();
  Agents job(job_settings);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) job.add().enter(t0);
  job.poll(t0);
  job.agents[0]->beat();
  for (int i = 1; i < 3; ++i) job.agents[i]->beat();
  ASSERT_FALSE(job.agents[1]->watch(t0));
  for (int i = 1; i < 3; ++i) job.agents[i]->beat();
  const auto end = job.agents[1]->watch(t0 + 3s);
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->failure);
  EXPECT_NE(end->reason.find("node 0 (agent 0) was lost"), std::string::npos) << end->reason;
}

TEST(RoundRendezvous, UnderInJobRecoveryARunningRoundDoesNotGrow) {
  Agents job(InJobRound::in_job_settings());
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) job.add().enter(t0);
  ASSERT_TRUE(job.poll(t0 + 2s)[1]);
  RoundRendezvous& late = job.add();
  late.enter(t0 + 3s);
  EXPECT_FALSE(late.poll_round(t0 + 3s));
  for (int i = 0; i < 2; ++i) job.agents[i]->beat();
  EXPECT_FALSE(job.agents[0]->watch(t0 + 3s)) << "a newcomer takes a lost node's place, or waits";
}

}  // namespace
}  // namespace tandem::launch
