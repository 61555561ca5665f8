// Ranks refuse to train on data sets that differ, and name the ranks that differ; an image folder's
// fingerprint ignores where the folder is mounted but not a missing file.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/data/data_agreement.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

// Runs the check on three thread ranks, rank r holding make(r); returns each rank's error ("" if none).
std::vector<std::string> check_on_three_ranks(const std::function<data::TensorDataset(int rank)>& make) {
  std::vector<std::string> errors(3);
  testing::run_thread_ranks(3, [&](int rank, comm::Communicator& communicator) {
    try {
      data::verify_ranks_hold_same_data(communicator, make(rank), "training data");
    } catch (const InvalidArgument& error) {
      errors[rank] = error.what();
    }
  });
  return errors;
}

TEST(DataAgreement, SameDataPasses) {
  const auto errors = check_on_three_ranks([](int) { return data::TensorDataset(torch::ones({5, 2}), torch::zeros({5})); });
  for (const auto& error : errors) EXPECT_EQ(error, "");
}

TEST(DataAgreement, OneChangedSampleFailsEveryRankNamingTheOddOne) {
  const auto errors = check_on_three_ranks([](int rank) {
    torch::Tensor targets = torch::zeros({5});
    if (rank == 1) targets[3] = 1;
    return data::TensorDataset(torch::ones({5, 2}), targets);
  });
  for (const auto& error : errors) {
    std::printf("%s\n", error.c_str());
    EXPECT_NE(error.find("training data differ"), std::string::npos) << error;
    EXPECT_NE(error.find("ranks [0, 2] have 5 samples"), std::string::npos) << error;
    EXPECT_NE(error.find("ranks [1] have 5 samples"), std::string::npos) << error;
  }
}

TEST(DataAgreement, ImageFolderFingerprintFollowsNamesAndLabelsNotTheMountPoint) {
  const std::string original = testing::write_tiny_image_folder("agreement_a", 3);
  const std::string copy = testing::make_temp_dir("agreement_b");
  std::filesystem::copy(original, copy, std::filesystem::copy_options::recursive);
  const auto fingerprint_of = [](const std::string& root) {
    return data::ImageFolderDataset(data::read_split_data(root, 0.0).train, data::ImageFolderOptions{}).fingerprint();
  };
  EXPECT_EQ(fingerprint_of(original), fingerprint_of(copy));
  std::filesystem::remove(copy + "/square/img1.png");
  EXPECT_NE(fingerprint_of(original), fingerprint_of(copy));
}

}  // namespace
}  // namespace tandem
