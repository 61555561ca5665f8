// The mpi backend: the same hand-computed checks as the gloo backend at world size 2 under mpirun, a world of
// one without mpirun (MPI singleton start), progress without the caller's help, refused dtypes, a layout
// that disagrees with MPI, a collective only one rank issues (TimeoutError instead of a hang), and a rank
// that issues none, which the timeout names.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <regex>

#include "support/collective_checks.h"
#include "support/processes.h"
#include "tandem/comm/mpi/mpi_communicator.h"
#include "tandem/comm/mpi/mpi_store.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

using comm::ReduceOp;
using testing::check_all_collectives;

int count_of(const std::string& text, const std::string& pattern) {
  const std::regex expression(pattern);
  auto begin = std::sregex_iterator(text.begin(), text.end(), expression);
  return static_cast<int>(std::distance(begin, std::sregex_iterator()));
}

// The parts every world size shares: all collectives, a non-contiguous tensor, refused dtypes.
void check_backend(comm::Communicator& comm) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    // 1 element, an odd size that no world size divides, and 4 MB of float32 (8 MB of float64).
    for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
      check_all_collectives(comm.rank(), comm, numel, dtype);
    }
  }
  // A transposed view: reduced through a contiguous copy, written back into the caller's tensor.
  torch::Tensor base = torch::arange(12, torch::kFloat32).view({3, 4}) + comm.rank();
  torch::Tensor view = base.t();
  comm.all_reduce(view, ReduceOp::Max)->wait();
  EXPECT_TRUE(torch::equal(base, torch::arange(12, torch::kFloat32).view({3, 4}) + (comm.world_size() - 1)));

  torch::Tensor half = torch::ones({4}, torch::kFloat16);
  try {
    comm.all_reduce(half, ReduceOp::Sum);
    ADD_FAILURE() << "all_reduce on float16 was accepted";
  } catch (const UnsupportedError& error) {
    EXPECT_NE(std::string(error.what()).find("backend mpi does not support all_reduce(sum) on Half"),
              std::string::npos)
        << error.what();
  }
  // Copies move bytes, so any dtype broadcasts.
  torch::Tensor flags = torch::full({5}, comm.rank() == 0, torch::kBool);
  comm.broadcast(flags, 0)->wait();
  EXPECT_TRUE(flags.all().item<bool>());
}

TEST(MpiCollectivesWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of MpiCollectives";
  InitOptions options;
  options.backend = "mpi";
  options.timeout = std::chrono::seconds(60);
  init_process_group(options);
  ASSERT_EQ(world_size(), std::stoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  ASSERT_EQ(rank(), std::stoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  comm::Communicator& comm = default_group().communicator();
  EXPECT_EQ(comm.backend_name(), "mpi");
  check_backend(comm);
  testing::check_average_edges(rank(), comm);
  testing::check_emulated_reductions(rank(), comm);

  // Progress without the caller: the collective completes while this thread only polls, never waits.
  torch::Tensor big = torch::full({int64_t{4} << 20}, 1.0f);
  comm::WorkPtr work = comm.all_reduce(big, ReduceOp::Sum);
  while (!work->is_completed()) std::this_thread::yield();
  work->wait();
  EXPECT_TRUE(torch::all(big == static_cast<float>(world_size())).item<bool>());

  // Large all-reduces go in pieces and average piece by piece: a 2-D tensor whose last piece is partial.
  const auto rank_matrix = [](int r) { return testing::rank_values(r, 5 * 300001, torch::kFloat).view({5, 300001}); };
  torch::Tensor matrix = rank_matrix(rank());
  comm.all_reduce(matrix, ReduceOp::Avg)->wait();
  torch::Tensor expected = torch::zeros_like(matrix);
  for (int r = 0; r < world_size(); ++r) expected += rank_matrix(r);
  EXPECT_TRUE(torch::allclose(matrix, expected / world_size()));

  torch::Tensor value = torch::tensor({static_cast<double>(rank())});
  EXPECT_DOUBLE_EQ(reduce_value(value, true).item<double>(), (world_size() - 1) / 2.0);
  destroy_process_group();
}

TEST(MpiCollectives, TwoRanksUnderMpirun) {
  testing::ProcessResult result = testing::run_mpirun_ranks(2, "MpiCollectivesWorker.Run");
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_of(result.output, R"(\[       OK \] MpiCollectivesWorker\.Run)"), 2) << result.output;
}

TEST(MpiLargeMessagesWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of MpiLargeMessages";
  comm::MpiCommunicator comm(comm::detect_rank_layout(), std::chrono::seconds(120),
                             comm::open_store_over_mpi(std::chrono::seconds(120)));
  // More bytes and elements than one MPI call can count (an int): DDP broadcasts a model of this size as one
  // flat buffer. min() and max() check every element without a second 2 GiB tensor.
  const int64_t numel = (int64_t{1} << 31) + 8;
  torch::Tensor big = torch::full({numel}, comm.rank() == 0 ? 1 : 0, torch::kUInt8);
  comm.broadcast(big, 0)->wait();
  EXPECT_EQ(big.min().item<int>(), 1);
  EXPECT_EQ(big.max().item<int>(), 1);
  comm.all_reduce(big, ReduceOp::Sum)->wait();
  EXPECT_EQ(big.min().item<int>(), comm.world_size());
  EXPECT_EQ(big.max().item<int>(), comm.world_size());
}

TEST(MpiLargeMessages, BroadcastAndAllReduceOfMoreThan2GiB) {
  testing::ProcessResult result =
      testing::run_mpirun_ranks(2, "MpiLargeMessagesWorker.Run", std::chrono::seconds(240));
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_of(result.output, R"(\[       OK \] MpiLargeMessagesWorker\.Run)"), 2) << result.output;
}

TEST(MpiSingletonWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as the process of MpiSingleton";
  comm::RankLayout wrong;
  wrong.world_size = 2;
  wrong.source = "env";
  try {
    comm::MpiCommunicator mismatched(wrong, std::chrono::seconds(10), c10::make_intrusive<c10d::HashStore>());
    ADD_FAILURE() << "a layout of 2 ranks was accepted by a world of 1";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("mpirun"), std::string::npos) << error.what();
  }
  comm::MpiCommunicator comm(comm::RankLayout{}, std::chrono::seconds(30), c10::make_intrusive<c10d::HashStore>());
  EXPECT_EQ(comm.world_size(), 1);
  check_backend(comm);
}

TEST(MpiSingleton, WorldOfOneWithoutMpirun) {
  // Open MPI starts a singleton by itself; as root (CI containers) it must be told that this is intended.
  testing::ProcessResult result = testing::run_worker_process(
      "MpiSingletonWorker.Run", {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                 {"OMPI_MCA_btl_vader_single_copy_mechanism", "none"}});
  ASSERT_FALSE(result.timed_out) << "the singleton hung:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_of(result.output, R"(\[       OK \] MpiSingletonWorker\.Run)"), 1) << result.output;
}

// mpirun kills the job once one rank exits, so each rank leaves only after every rank has reported: it marks
// itself in TANDEM_TEST_MARKERS and waits (at most 30 s) for every rank's mark.
void leave_once_every_rank_reported(const comm::Communicator& comm) {
  const std::string marker_dir = std::getenv("TANDEM_TEST_MARKERS");
  std::ofstream(marker_dir + "/" + std::to_string(comm.rank())).put('1');
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto everyone_reported = [&] {
    for (int r = 0; r < comm.world_size(); ++r) {
      if (!std::filesystem::exists(marker_dir + "/" + std::to_string(r))) return false;
    }
    return true;
  };
  while (!everyone_reported() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Runs `worker_test` on 2 ranks under mpirun with a fresh marker folder (see leave_once_every_rank_reported).
testing::ProcessResult run_reporting_mpi_ranks(const std::string& worker_test) {
  std::string markers = ::testing::TempDir() + "tandem_mpi_markers_" + std::to_string(::getpid());
  std::filesystem::remove_all(markers);
  std::filesystem::create_directories(markers);
  testing::ProcessResult result =
      testing::run_mpirun_ranks(2, worker_test, std::chrono::seconds(60), {{"TANDEM_TEST_MARKERS", markers}});
  std::filesystem::remove_all(markers);
  return result;
}

TEST(MpiTimeoutWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of MpiTimeout";
  comm::MpiCommunicator comm(comm::detect_rank_layout(), std::chrono::seconds(2),
                             comm::open_store_over_mpi(std::chrono::seconds(30)));
  // The ranks disagree on the collective: rank 0 all-reduces, the others wait at a barrier. Neither can
  // complete; each must fail by its deadline with the operation's name.
  torch::Tensor tensor = torch::ones({16});
  comm::WorkPtr work = comm.rank() == 0 ? comm.all_reduce(tensor, ReduceOp::Sum) : comm.barrier();
  std::string expected = comm.rank() == 0 ? "all_reduce(sum) #1 on rank 0/2" : "barrier #1 on rank 1/2";
  try {
    work->wait();
    ADD_FAILURE() << "mismatched collectives completed";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    std::printf("TIMEOUT SEEN: %s\n", error.what());
  }
  // The communicator is now unusable, and says so at once instead of queueing behind the stuck collective.
  EXPECT_THROW(comm.barrier(), CommError);
  std::fflush(stdout);
  leave_once_every_rank_reported(comm);
  // MPI cannot cancel a collective in flight, and finalising would wait for it; a program that met a timeout
  // exits with failure, as this worker does once its checks have passed.
  std::_Exit(::testing::Test::HasFailure() ? 1 : 3);
}

TEST(MpiTimeout, MismatchedCollectivesFailByTheDeadline) {
  testing::ProcessResult result = run_reporting_mpi_ranks("MpiTimeoutWorker.Run");
  ASSERT_FALSE(result.timed_out) << "a rank hung past its collective timeout:\n" << result.output;
  EXPECT_EQ(count_of(result.output, "TIMEOUT SEEN: .*timed out after 2 s"), 2) << result.output;
  EXPECT_EQ(count_of(result.output, "Failure"), 0) << result.output;
}

TEST(MpiMissingRankWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of MpiMissingRank";
  comm::MpiCommunicator comm(comm::detect_rank_layout(), std::chrono::seconds(2),
                             comm::open_store_over_mpi(std::chrono::seconds(30)));
  // Rank 1 stays alive, and its heartbeat with it, but never issues the collective.
  if (comm.rank() == 0) {
    torch::Tensor tensor = torch::ones({16});
    try {
      comm.all_reduce(tensor, ReduceOp::Sum)->wait();
      ADD_FAILURE() << "an all-reduce without rank 1 completed";
    } catch (const TimeoutError& error) {
      std::printf("TIMEOUT SEEN: %s\n", error.what());
    }
    std::fflush(stdout);
  }
  leave_once_every_rank_reported(comm);
  std::_Exit(::testing::Test::HasFailure() ? 1 : 3);
}

TEST(MpiMissingRank, TimeoutNamesTheRankThatNeverArrived) {
  testing::ProcessResult result = run_reporting_mpi_ranks("MpiMissingRankWorker.Run");
  ASSERT_FALSE(result.timed_out) << "a rank hung past its collective timeout:\n" << result.output;
  const std::string names_rank_1 =
      R"(TIMEOUT SEEN: all_reduce\(sum\) #1 on rank 0/2 timed out after 2 s: rank\(s\) 1 never reached it)";
  EXPECT_EQ(count_of(result.output, names_rank_1), 1) << result.output;
  EXPECT_EQ(count_of(result.output, "Failure"), 0) << result.output;
}

}  // namespace
}  // namespace tandem
