// An error on one rank of an mpirun job ends the whole job at once. Finalising MPI at exit would wait for the
// peers, which wait in a collective for the failed rank until their own timeout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/processes.h"
#include "support/tiny_datasets.h"

namespace tandem {
namespace {

TEST(MpiErrorExit, OneRankFailingMidTrainingEndsTheJobBeforeThePeersTimeOut) {
  // Two copies of one image folder with the same names and labels (so the ranks agree that they hold the same
  // data set), but rank 1's images cannot be decoded: it fails at its first batch, while rank 0 trains its
  // first step and waits in the gradient all-reduce.
  const std::string good = testing::write_tiny_image_folder("mpi_error_exit_good", 8);
  const std::string bad = testing::make_temp_dir("mpi_error_exit_bad");
  std::filesystem::copy(good, bad, std::filesystem::copy_options::recursive |
                                       std::filesystem::copy_options::overwrite_existing);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(bad)) {
    if (entry.is_regular_file()) std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << "not a png";
  }
  const std::string run_dir = testing::make_temp_dir("mpi_error_exit_run");
  const auto train = [&](const std::string& data_dir) {
    // The peer's all-reduce would wait 200 s for the failed rank: far past this test's deadline.
    return std::vector<std::string>{testing::tandem_cli(), "train", "--backend", "mpi", "--data", data_dir,
                                    "--model", "resnet18", "--image-size", "16", "--batch-size", "4",
                                    "--epochs", "1", "--no-shuffle", "--timeout", "200", "--threads", "1",
                                    "--run-dir", run_dir};
  };
  // Open MPI's MPMD form gives each rank its own command line.
  std::vector<std::string> argv = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1"};
  for (const auto& arg : train(good)) argv.push_back(arg);
  for (const char* arg : {":", "-np", "1"}) argv.push_back(arg);
  for (const auto& arg : train(bad)) argv.push_back(arg);
  const testing::ProcessResult result = testing::run_process(
      argv, {{"OMPI_MCA_btl_vader_single_copy_mechanism", "none"}, {"OMP_NUM_THREADS", "1"}},
      std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << "the job outlived its failed rank:\n" << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("mpi_error_exit_bad"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem
