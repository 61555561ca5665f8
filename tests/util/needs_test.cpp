// The one wording of "a setting given without the one it depends on" (tandem/util/needs.h). The commands' and the
// library's refusals are asserted in the bad-input tables; these pin the sentence they share.
#include <gtest/gtest.h>

#include "tandem/util/needs.h"

namespace tandem {
namespace {

TEST(Needs, SaysWhatTheSettingNeedsAndWhy) {
  EXPECT_EQ(needs("--zero", "--strategy ddp"), "--zero needs --strategy ddp");
  EXPECT_EQ(needs("`rdzv_backend` c10d", "`run_id`", "the job's id, the same on every node"),
            "`rdzv_backend` c10d needs `run_id`: the job's id, the same on every node");
}

TEST(OnlyReadWith, AdvisesAddingTheOtherOrDroppingTheSetting) {
  EXPECT_EQ(only_read_with("--short-steps", "--end-to-end"),
            "--short-steps is only read with --end-to-end; add that or drop --short-steps");
  EXPECT_EQ(only_read_with("--pytorch-script", "--compare pytorch", "drop --compare none or --pytorch-script"),
            "--pytorch-script is only read with --compare pytorch; drop --compare none or --pytorch-script");
}

}  // namespace
}  // namespace tandem
