// Where a process finds its rank: explicit values, torchrun's variables, SLURM's and Open MPI's, read through a
// fake environment so every scheduler's layout can be checked on one machine.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "tandem/comm/rank_layout.h"
#include "tandem/comm/slurm_nodelist.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto found = values.find(name);
    if (found == values.end()) return std::nullopt;
    return found->second;
  };
}

using Hosts = std::vector<std::string>;

TEST(SlurmNodelist, ExpandsCompressedForms) {
  EXPECT_EQ(expand_slurm_nodelist("node[03-05,07]"), (Hosts{"node03", "node04", "node05", "node07"}));
  EXPECT_EQ(expand_slurm_nodelist("a[1-2]-b[1-2]"), (Hosts{"a1-b1", "a1-b2", "a2-b1", "a2-b2"}));
  EXPECT_EQ(expand_slurm_nodelist("login1,gpu[8-10],cpu7"), (Hosts{"login1", "gpu8", "gpu9", "gpu10", "cpu7"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (Hosts{"single"}));
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  EXPECT_THROW(expand_slurm_nodelist("node[03-05"), InvalidArgument);
  EXPECT_THROW(expand_slurm_nodelist("node[5-3]"), InvalidArgument);
  EXPECT_THROW(expand_slurm_nodelist("node[a-b]"), InvalidArgument);
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  EXPECT_THROW(expand_slurm_tasks_per_node("2(x3"), InvalidArgument);
  EXPECT_THROW(expand_slurm_tasks_per_node("two"), InvalidArgument);
}

TEST(RankLayout, WithoutAnyVariablesRunsAlone) {
  RankLayout layout = detect_rank_layout({}, fake_env({}));
  EXPECT_EQ(layout.source, "single");
  EXPECT_EQ(layout.rank, 0);
  EXPECT_EQ(layout.world_size, 1);
  EXPECT_FALSE(layout.distributed());
}

TEST(RankLayout, ReadsTorchrunVariables) {
  RankLayout layout = detect_rank_layout({}, fake_env({{"RANK", "5"},
                                                       {"WORLD_SIZE", "8"},
                                                       {"LOCAL_RANK", "1"},
                                                       {"LOCAL_WORLD_SIZE", "4"},
                                                       {"GROUP_RANK", "1"},
                                                       {"MASTER_ADDR", "10.0.0.1"},
                                                       {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(layout.source, "env");
  EXPECT_EQ(layout.rank, 5);
  EXPECT_EQ(layout.world_size, 8);
  EXPECT_EQ(layout.local_rank, 1);
  EXPECT_EQ(layout.local_world_size, 4);
  EXPECT_EQ(layout.node_rank, 1);
  EXPECT_EQ(layout.master_addr, "10.0.0.1");
  EXPECT_EQ(layout.master_port, 1234);
  EXPECT_FALSE(layout.launcher_serves_store);
  EXPECT_EQ(layout.store_file, "");
}

TEST(RankLayout, ReadsWhereTheLauncherKeepsTheStore) {
  RankLayout agent = detect_rank_layout({}, fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_TRUE(agent.launcher_serves_store);
  EXPECT_EQ(agent.restart_count, 0);
  RankLayout restarted = detect_rank_layout({}, fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                                          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                          {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  EXPECT_EQ(restarted.restart_count, 2);
  RankLayout not_agent = detect_rank_layout({}, fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                                          {"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  EXPECT_FALSE(not_agent.launcher_serves_store);
  RankLayout file = detect_rank_layout({}, fake_env({{"RANK", "1"}, {"WORLD_SIZE", "2"},
                                                     {"TANDEM_STORE_FILE", "/tmp/tandem-run-x/store"}}));
  EXPECT_EQ(file.store_file, "/tmp/tandem-run-x/store");
}

TEST(RankLayout, ReadsSlurmWithCompressedNodeListAndTaskCounts) {
  // Task 5 of 7 on the third node of node[03-05,07], with 2 tasks on each of the first three nodes.
  RankLayout layout = detect_rank_layout({}, fake_env({{"SLURM_PROCID", "5"},
                                                       {"SLURM_NTASKS", "7"},
                                                       {"SLURM_LOCALID", "1"},
                                                       {"SLURM_NODEID", "2"},
                                                       {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                                       {"SLURM_JOB_NODELIST", "node[03-05,07]"}}));
  EXPECT_EQ(layout.source, "slurm");
  EXPECT_EQ(layout.rank, 5);
  EXPECT_EQ(layout.world_size, 7);
  EXPECT_EQ(layout.local_rank, 1);
  EXPECT_EQ(layout.local_world_size, 2);
  EXPECT_EQ(layout.node_rank, 2);
  EXPECT_EQ(layout.master_addr, "node03");
  EXPECT_EQ(layout.master_port, kDefaultMasterPort);
}

TEST(RankLayout, SlurmLastNodeGetsItsOwnTaskCount) {
  RankLayout layout = detect_rank_layout({}, fake_env({{"SLURM_PROCID", "6"},
                                                       {"SLURM_NTASKS", "7"},
                                                       {"SLURM_LOCALID", "0"},
                                                       {"SLURM_NODEID", "3"},
                                                       {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                                       {"SLURM_NODELIST", "a[1-2]-b[1-2]"}}));
  EXPECT_EQ(layout.local_world_size, 1);
  EXPECT_EQ(layout.master_addr, "a1-b1");
}

TEST(RankLayout, SlurmJobsTakeAPortFromTheirIdUnlessOneIsExported) {
  // Two jobs on one node must not share the rendezvous port; one fixed default let them reach each other's store.
  auto job = [](const std::string& id, std::optional<std::string> exported_port) {
    std::map<std::string, std::string> env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", id}};
    if (exported_port) env["MASTER_PORT"] = *exported_port;
    return detect_rank_layout({}, fake_env(env)).master_port;
  };
  EXPECT_EQ(job("4321", std::nullopt), 24321);
  EXPECT_EQ(job("123457", std::nullopt), 23457);
  EXPECT_NE(job("4321", std::nullopt), job("4322", std::nullopt));
  EXPECT_EQ(job("4321", "29999"), 29999);
}

TEST(RankLayout, SlurmNtasksPerNodeAndExportedMasterWin) {
  RankLayout layout = detect_rank_layout({}, fake_env({{"SLURM_PROCID", "3"},
                                                       {"SLURM_NTASKS", "4"},
                                                       {"SLURM_LOCALID", "1"},
                                                       {"SLURM_NODEID", "1"},
                                                       {"SLURM_NTASKS_PER_NODE", "2"},
                                                       {"SLURM_TASKS_PER_NODE", "3(x2)"},
                                                       {"SLURM_NODELIST", "gpu[1-2]"},
                                                       {"MASTER_ADDR", "head"},
                                                       {"MASTER_PORT", "4000"}}));
  EXPECT_EQ(layout.local_world_size, 2);
  EXPECT_EQ(layout.master_addr, "head");
  EXPECT_EQ(layout.master_port, 4000);
}

TEST(RankLayout, ReadsOpenMpi) {
  // mpirun -np 4 across two nodes, two ranks each: rank 3 is the second rank on the second node.
  RankLayout layout = detect_rank_layout({}, fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                                       {"OMPI_COMM_WORLD_SIZE", "4"},
                                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                       {"OMPI_COMM_WORLD_NODE_RANK", "1"},
                                                       {"MASTER_ADDR", "host0"}}));
  EXPECT_EQ(layout.source, "openmpi");
  EXPECT_EQ(layout.rank, 3);
  EXPECT_EQ(layout.world_size, 4);
  EXPECT_EQ(layout.local_rank, 1);
  EXPECT_EQ(layout.local_world_size, 2);
  EXPECT_EQ(layout.node_rank, 1);
  EXPECT_EQ(layout.master_addr, "host0");
}

TEST(RankLayout, OpenMpiNodeIndexIsNotItsNodeRank) {
  // Rank 4 of 6, three per node, sits on node 1; OMPI_COMM_WORLD_NODE_RANK counts processes on the node (2).
  RankLayout layout = detect_rank_layout({}, fake_env({{"OMPI_COMM_WORLD_RANK", "4"},
                                                       {"OMPI_COMM_WORLD_SIZE", "6"},
                                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                                       {"OMPI_COMM_WORLD_NODE_RANK", "2"}}));
  EXPECT_EQ(layout.node_rank, 1);
}

TEST(RankLayout, PrecedenceIsExplicitThenTorchrunThenSlurmThenOpenMpi) {
  std::map<std::string, std::string> all{{"RANK", "1"},         {"WORLD_SIZE", "2"},           {"SLURM_PROCID", "2"},
                                         {"SLURM_NTASKS", "3"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}};
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).source, "env");
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).rank, 1);

  ExplicitLayout given;
  given.rank = 4;
  given.world_size = 5;
  given.master_port = 7000;
  RankLayout explicit_layout = detect_rank_layout(given, fake_env(all));
  EXPECT_EQ(explicit_layout.source, "explicit");
  EXPECT_EQ(explicit_layout.rank, 4);
  EXPECT_EQ(explicit_layout.world_size, 5);
  EXPECT_EQ(explicit_layout.master_port, 7000);

  all.erase("RANK");
  all.erase("WORLD_SIZE");
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).source, "slurm");
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).rank, 2);
  all.erase("SLURM_PROCID");
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).source, "openmpi");
  EXPECT_EQ(detect_rank_layout({}, fake_env(all)).rank, 3);
}

// Asserts that detect_rank_layout rejects `env` with InvalidArgument whose message mentions `needle`.
void expect_rejected(const std::map<std::string, std::string>& env, const std::string& needle) {
  try {
    RankLayout layout = detect_rank_layout({}, fake_env(env));
    ADD_FAILURE() << "accepted rank " << layout.rank << " of " << layout.world_size << "; expected: " << needle;
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(RankLayout, RejectsInconsistentOrMalformedValues) {
  expect_rejected({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "rank 2 is outside world size 2");
  expect_rejected({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "rank 4 is outside world size 4");
  expect_rejected({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "rank -1");
  expect_rejected({{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK='one' is not an integer");
  expect_rejected({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}, "WORLD_SIZE='2x' is not an integer");
  expect_rejected({{"RANK", "0"}, {"WORLD_SIZE", " 2"}}, "WORLD_SIZE=' 2' is not an integer");
  expect_rejected({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}, "is not an integer");
  expect_rejected({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "world size must be at least 1");
  expect_rejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "master port 70000");
  expect_rejected({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                  "local rank 2 is outside local world size 2");
  expect_rejected({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n[1-"}}, "SLURM node list");
}

}  // namespace
}  // namespace tandem::comm

namespace tandem::comm {
namespace {

std::string half_set_refusal(std::map<std::string, std::string> values, const ExplicitLayout& given = {}) {
  try {
    require_whole_rank_environment(given, fake_env(std::move(values)));
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

// A part of torchrun's set read alone left the process training as world size 1, where the script meant a rank.
TEST(WholeRankEnvironment, PartOfTorchrunsSetIsRefusedNamingTheVariable) {
  EXPECT_NE(half_set_refusal({{"WORLD_SIZE", "2"}}).find("WORLD_SIZE=2 is set without RANK"), std::string::npos);
  EXPECT_NE(half_set_refusal({{"LOCAL_RANK", "1"}}).find("LOCAL_RANK=1 is set without RANK"), std::string::npos);
  EXPECT_NE(half_set_refusal({{"MASTER_PORT", "29500"}}).find("MASTER_PORT=29500"), std::string::npos);
  EXPECT_NE(half_set_refusal({{"RANK", "1"}}).find("RANK=1 is set without WORLD_SIZE"), std::string::npos);
}

TEST(WholeRankEnvironment, WholeSetsNoSetAndExplicitValuesPass) {
  EXPECT_EQ(half_set_refusal({}), "");
  EXPECT_EQ(half_set_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), "");
  EXPECT_EQ(half_set_refusal({{"SLURM_PROCID", "0"}, {"MASTER_ADDR", "node0"}}), "");
  EXPECT_EQ(half_set_refusal({{"OMPI_COMM_WORLD_RANK", "0"}, {"MASTER_PORT", "29500"}}), "");
  ExplicitLayout given;
  given.rank = 0;
  given.world_size = 1;
  EXPECT_EQ(half_set_refusal({{"WORLD_SIZE", "2"}}, given), "");
}

}  // namespace
}  // namespace tandem::comm
