// `tandem train` continuing a run dir it cannot continue, through the built binary on tiny data: another model,
// another number of classes, another seed, a checkpoint whose header is damaged, cut short or lacks a value. Each
// is one line naming the checkpoint, what is wrong in plain words and what to do (issue 29); a resume with
// another model was a 6 KB list of every tensor that blamed --strict, which nobody had given. Beside them, two
// runs whose output was wrong: a --steps stop whose progress bar counted to the epoch's end (and so did its
// ETA), and an image folder with --val-split 0 that reported an accuracy of 0 of 0 samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <ostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/bad_input.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::app::bad_train_run {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;
using testing::read_lines;

constexpr const char* kFirstCheckpoint = "checkpoint-0001-00000000.safetensors";

// `tandem train` for one epoch on `data` into `run_dir` with small batches and one thread, plus `args`.
std::vector<std::string> train_args(const std::string& data, const std::string& run_dir,
                                    const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"train", "--data", data, "--epochs", "1", "--batch-size", "8", "--threads", "1",
                                   "--no-tensorboard", "--no-report", "--run-dir", run_dir};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// `args` with `flag`'s value replaced (train_args sets --epochs, --batch-size and --threads).
std::vector<std::string> with_value(std::vector<std::string> args, const std::string& flag, const std::string& value) {
  *(std::find(args.begin(), args.end(), flag) + 1) = value;
  return args;
}

testing::ProcessResult run_tandem(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::tandem_cli()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, {}, std::chrono::seconds(120));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A byte inside the checkpoint's JSON header that is not valid UTF-8: the parser's own message was
// "[json.exception.parse_error.101] ... ill-formed UTF-8 byte".
void break_header(const std::string& checkpoint) {
  std::string bytes = read_bytes(checkpoint);
  bytes[8 + 20] = '\xff';
  write_bytes(checkpoint, bytes);
}

// The checkpoint as a copy cut short leaves it: its last tensors lie past the end.
void cut_short(const std::string& checkpoint) { fs::resize_file(checkpoint, fs::file_size(checkpoint) / 2); }

// The checkpoint rewritten as one of the format before checksums whose metadata lacks its epoch: nothing checks
// it before the loop reads its values.
void drop_epoch(const std::string& checkpoint) {
  checkpoint::TensorFile file = checkpoint::load_safetensors(checkpoint);
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : file.metadata) {
    if (key != "epoch" && key.rfind("crc32c.", 0) != 0) metadata[key] = value;
  }
  metadata["format"] = "tandem-checkpoint-2";
  checkpoint::save_safetensors(checkpoint, file.tensors, metadata);
}

// One row: a run dir in which the default cnn trained an epoch, `damage`d, then continued with `args`.
struct BadRunDir {
  std::string name;
  std::function<void(const std::string& checkpoint)> damage;  // null: the checkpoint is left whole
  std::vector<std::string> args;
  // What the error line holds besides the checkpoint's name and the remedy's flag (--run-dir).
  std::vector<std::string> mentions;
  // Refused while the run dir is searched, before the run starts: the error is the only line. Otherwise the
  // configuration comes first, as the checkpoint is read once the run has started.
  bool only_line = false;
  // Train on an image folder of RGB images (the ResNets take no others) rather than MNIST files.
  bool rgb = false;
};

void PrintTo(const BadRunDir& row, std::ostream* out) { *out << row.name; }

class BadTrainRun : public ::testing::TestWithParam<BadRunDir> {};

TEST_P(BadTrainRun, IsOneLineNamingTheCheckpointWhatIsWrongAndWhatToDo) {
  const BadRunDir& row = GetParam();
  const std::string data = row.rgb ? testing::write_tiny_image_folder("bad_run_" + row.name, 8)
                                   : testing::write_tiny_mnist("bad_run_" + row.name, 32, 8);
  const std::vector<std::string> data_args =
      row.rgb ? std::vector<std::string>{"--image-size", "32"} : std::vector<std::string>{};
  const std::string run_dir = make_temp_dir("bad_run_dir_" + row.name) + "/run";
  const testing::ProcessResult first = run_tandem(train_args(data, run_dir, data_args));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string checkpoint = run_dir + "/" + kFirstCheckpoint;
  ASSERT_TRUE(fs::exists(checkpoint)) << first.output;
  if (row.damage) row.damage(checkpoint);

  std::vector<std::string> args = data_args;
  args.insert(args.end(), row.args.begin(), row.args.end());
  testing::BadInput input{row.name, train_args(data, run_dir, args), row.mentions};
  input.mentions.push_back(checkpoint);
  input.mentions.push_back("--run-dir");
  input.only_line = row.only_line;
  const testing::ProcessResult result = testing::expect_one_line_refusal(input);
  EXPECT_EQ(result.output.find("resuming from"), std::string::npos) << "the run went on:\n" << result.output;
  EXPECT_TRUE(fs::exists(checkpoint)) << "the refusal moved the user's checkpoint";
  EXPECT_EQ(result.output.find("--strict"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("json.exception"), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadTrainRun,
    ::testing::Values(
        // The model's class and size, the first tensor that differs, and the flags to change.
        BadRunDir{"another_model",
                  nullptr,
                  {"--model", "resnet18"},
                  {"was written for another model (the run was trained with --model cnn)",
                   "the checkpoint holds a tandem::nn::CnnNetImpl of ",
                   "this run's model is a tandem::nn::ResNetImpl of ", "'conv1.weight' is [",
                   "resume with the --model and --num-classes the run was trained with"},
                  /*only_line=*/false,
                  /*rgb=*/true},
        // The same class with BatchNorm layers: the first tensor that the checkpoint lacks.
        BadRunDir{"the_model_with_batch_norm",
                  nullptr,
                  {"--model", "cnn-bn"},
                  {"was written for another model (the run was trained with --model cnn)", "is not in the checkpoint"}},
        BadRunDir{"another_number_of_classes",
                  nullptr,
                  {"--num-classes", "12"},
                  {"was written for another model", "'output.weight' is [10, ", "in the checkpoint, [12, ",
                   "--num-classes"}},
        BadRunDir{"another_seed", nullptr, {"--seed", "7"}, {"--seed 0", "resume with the same"}},
        // Damage that leaves no intact checkpoint to fall back on.
        BadRunDir{"header_not_json",
                  break_header,
                  {},
                  {"is damaged", "its header is not valid JSON at byte"},
                  /*only_line=*/true},
        BadRunDir{"cut_short", cut_short, {}, {"is damaged", "(the file was cut short)"}, /*only_line=*/true},
        // Damage only the loop's reading finds: the checkpoint before it would be continued once it is moved.
        BadRunDir{"metadata_without_epoch",
                  drop_epoch,
                  {},
                  {"checkpoint metadata lacks 'epoch'", std::string("move ") + kFirstCheckpoint +
                                                            " out of the run dir to continue from the checkpoint "
                                                            "before it, or start a new run in another --run-dir"}}),
    [](const ::testing::TestParamInfo<BadRunDir>& info) { return info.param.name; });

// 32 samples in batches of 8: 4 batches an epoch, of which --steps 3 trains 3. The bar counted to 4 and its ETA to
// the epoch's end, a step the run never takes.
TEST(TrainRunOutput, AStepsStopCountsTheProgressBarToTheStop) {
  const std::string data = testing::write_tiny_mnist("steps_progress", 32, 8);
  const std::string run_dir = make_temp_dir("steps_progress_run") + "/run";
  const testing::ProcessResult result = run_tandem(train_args(data, run_dir, {"--steps", "3"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Without a terminal, a plain line for each batch of so short an epoch.
  EXPECT_NE(result.output.find("[epoch 0] batch 1/3 "), std::string::npos) << result.output;
  EXPECT_TRUE(std::regex_search(result.output, std::regex(R"(\[epoch 0\] batch 3/3 [^\n]* ETA 00:00\n)")))
      << result.output;
  EXPECT_EQ(result.output.find("/4 "), std::string::npos) << result.output;
}

// An image folder split with --val-split 0 leaves nothing to evaluate: the run says so once, and no epoch reports
// an accuracy, neither its line, nor metrics.jsonl, nor TensorBoard.
TEST(TrainRunOutput, NothingToEvaluateIsSaidOnceAndNoAccuracyIsWritten) {
  const std::string data = testing::write_tiny_image_folder("nothing_to_evaluate", 8);
  const std::string run_dir = make_temp_dir("nothing_to_evaluate_run") + "/run";
  const testing::ProcessResult result = run_tandem(
      {"train", "--data", data, "--val-split", "0", "--image-size", "28", "--epochs", "2", "--batch-size", "8",
       "--threads", "1", "--no-report", "--run-dir", run_dir});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[epoch 1] loss "), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("accuracy"), std::string::npos) << result.output;
  const std::string nothing = "the evaluation set holds no samples";
  const size_t said = result.output.find(nothing);
  EXPECT_NE(said, std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(nothing, said + 1), std::string::npos) << "said more than once:\n" << result.output;

  const std::string metrics = read_bytes(run_dir + "/metrics.jsonl");
  EXPECT_NE(metrics.find("\"loss\""), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("accuracy"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("\"total\""), std::string::npos) << metrics;
  // A tag is stored as its plain text in the event records.
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    ++event_files;
    const std::string events = read_bytes(entry.path().string());
    EXPECT_NE(events.find("learning_rate"), std::string::npos) << entry.path();
    EXPECT_EQ(events.find("accuracy"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(event_files, 1);
}

// A run dir that holds a checkpoint is continued without --resume: the configuration said "resume: no" and the
// run then resumed (issue 41).
TEST(TrainRunOutput, TheConfigurationNamesTheCheckpointAContinuedRunResumesFrom) {
  const std::string data = testing::write_tiny_mnist("resume_line", 32, 8);
  const std::string run_dir = make_temp_dir("resume_line_run") + "/run";
  const testing::ProcessResult first = run_tandem(train_args(data, run_dir, {"--steps", "2"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(std::regex_search(first.output, std::regex(R"(\n +resume: +no \(a new run\)\n)"))) << first.output;
  const testing::ProcessResult second = run_tandem(train_args(data, run_dir, {}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resume:        from " + run_dir + "/checkpoint-0000-00000002.safetensors"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
}

// The 32 samples' epoch stopped after 3 steps of 8, then continued with --batch-size 16: the 8 samples left make
// no batch of 16, so the epoch ends without a step. Its line recorded the optimizer's rate as the program set it
// (--lr, unscaled) rather than the rate of the epoch: the doubled global batch doubles the rate.
TEST(TrainRunOutput, AnEpochAResumeEndsWithoutAStepRecordsItsRate) {
  const std::string data = testing::write_tiny_mnist("no_step_rate", 32, 8);
  const std::string run_dir = make_temp_dir("no_step_rate_run") + "/run";
  const testing::ProcessResult first = run_tandem(train_args(data, run_dir, {"--steps", "3", "--lr", "0.25"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const testing::ProcessResult second =
      run_tandem(with_value(train_args(data, run_dir, {"--lr", "0.25"}), "--batch-size", "16"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("[epoch 0] loss "), std::string::npos) << second.output;
  EXPECT_NE(second.output.find(" lr 0.5\n"), std::string::npos) << second.output;
}

// Every image of the folder unreadable: --skip-bad-images skipped them all and trained on empty batches, exit 0
// (or, with the CNN, failed in LibTorch's own words).
TEST(TrainRunOutput, SkippingEveryImageIsOneLine) {
  const std::string data = make_temp_dir("all_bad_images");
  for (const char* label : {"a", "b"}) {
    fs::create_directories(data + "/" + label);
    for (int i = 0; i < 4; ++i) write_bytes(data + "/" + label + "/" + std::to_string(i) + ".png", "not a PNG");
  }
  const std::string run_dir = make_temp_dir("all_bad_images_run") + "/run";
  testing::BadInput input{"AllImagesUnreadable",
                          train_args(data, run_dir, {"--image-size", "16", "--val-split", "0", "--skip-bad-images"}),
                          {"error: the first ", " images read from " + data + " were all unreadable",
                           "--skip-bad-images leaves nothing to train on"},
                          2,
                          /*only_line=*/false};
  const testing::ProcessResult result = testing::expect_one_line_refusal(input);
  EXPECT_EQ(result.output.find("[epoch 0] loss"), std::string::npos) << "the epoch was reported:\n" << result.output;
}

// A batch that lost every image after good ones: the CNN got a batch of no rows and LibTorch 1.13 ended the run
// with "view size is not compatible with input tensor's size and stride". The rank runs it with a zero loss (so as
// to join the step's collectives), the run goes on, and the epoch's warning counts the batch with the images.
TEST(TrainRunOutput, ABatchThatLosesEveryImageAfterGoodOnesIsCountedAndTheRunGoesOn) {
  const std::string data = testing::write_tiny_image_folder("emptied_batch", 4);
  // In order (--no-shuffle, batches of 4): the circles, the squares, the triangles.
  for (int i = 0; i < 4; ++i) write_bytes(data + "/square/img" + std::to_string(i) + ".png", "not a PNG");
  const std::string run_dir = make_temp_dir("emptied_batch_run") + "/run";
  const testing::ProcessResult result =
      run_tandem(with_value(train_args(data, run_dir, {"--image-size", "16", "--val-split", "0", "--no-shuffle",
                                                       "--skip-bad-images"}),
                            "--batch-size", "4"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[epoch 0] loss "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("skipped 4 unreadable training images so far (--skip-bad-images); 1 of this rank's "
                               "batches lost every image"),
            std::string::npos)
      << result.output;
  // The emptied step has no gradient anywhere: the optimizer leaves it (momentum and weight decay would move the
  // weights on a zero gradient), and its record says so.
  const std::vector<std::string> steps = read_lines(run_dir + "/steps.jsonl");
  ASSERT_EQ(steps.size(), 3u) << result.output;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool emptied = i == 1;
    EXPECT_NE(steps[i].find(emptied ? "\"optimizer_stepped\":false" : "\"optimizer_stepped\":true"),
              std::string::npos)
        << "step " << i + 1 << ": " << steps[i];
  }
}

// A ResNet's last BatchNorm sees 1x1 pixels at --image-size 32, so a batch of 1 is one value per channel: LibTorch's
// own "Expected more than 1 value per channel when training" reached the user, after the run had started.
TEST(TrainRunOutput, ABatchOfOneAtBatchNormIsRefusedBeforeTheRun) {
  const std::string data = testing::write_tiny_image_folder("batch_of_one", 2);
  const std::string run_dir = make_temp_dir("batch_of_one_run") + "/run";
  testing::BadInput input{"BatchOfOne",
                          with_value(train_args(data, run_dir, {"--model", "resnet18", "--image-size", "32",
                                                                "--val-split", "0"}),
                                     "--batch-size", "1"),
                          {"--batch-size 1 gives one sample per rank to the BatchNorm layers of --model resnet18",
                           "use --batch-size 2 or more"},
                          2};
  testing::expect_one_line_refusal(input);
  EXPECT_FALSE(fs::exists(run_dir)) << "the run started";
}

// Under --uneven 3 samples over 2 ranks leave rank 1 a single sample, a batch no merge can grow: its BatchNorm
// failed alone in LibTorch's words while rank 0 waited for it.
TEST(TrainRunOutput, UnevenInputsThatLeaveARankOneSampleAtBatchNormAreRefused) {
  const std::string data = testing::write_tiny_mnist("uneven_one_sample", 3, 2);
  const std::string run_dir = make_temp_dir("uneven_one_sample_run") + "/run";
  std::vector<std::string> train = train_args(data, run_dir, {"--model", "cnn-bn", "--uneven", "--timeout", "30"});
  std::vector<std::string> args = {"run", "--nproc-per-node", "2", "--", testing::tandem_cli()};
  args.insert(args.end(), train.begin(), train.end());
  const testing::ProcessResult result = testing::expect_one_line_refusal(
      {"UnevenOneSample", args,
       {"--uneven shares 3 training samples over 2 ranks, which leaves a rank one sample for the BatchNorm layers "
        "of --model cnn-bn",
        "use fewer ranks, drop --uneven"},
       2,
       /*only_line=*/false});
  EXPECT_EQ(result.output.find("Expected more than 1 value"), std::string::npos) << result.output;
}

// --threads above the cores took turns on them without a word: the run goes on, after one warning.
TEST(TrainRunOutput, ThreadsAboveTheCoresAreWarnedOfOnce) {
  const std::string data = testing::write_tiny_mnist("many_threads", 16, 8);
  const std::string run_dir = make_temp_dir("many_threads_run") + "/run";
  // One thread more than the cores: as many as 1024 took minutes to start on a small machine.
  const std::string threads = std::to_string(std::max(1u, std::thread::hardware_concurrency()) + 1);
  const testing::ProcessResult result =
      run_tandem(with_value(train_args(data, run_dir, {"--steps", "1"}), "--threads", threads));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string warning = "warning: --threads gives each of this node's 1 rank " + threads + " intra-op threads";
  const size_t said = result.output.find(warning);
  EXPECT_NE(said, std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(warning, said + 1), std::string::npos) << "said more than once:\n" << result.output;
  EXPECT_NE(result.output.find("give --threads "), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::app::bad_train_run
