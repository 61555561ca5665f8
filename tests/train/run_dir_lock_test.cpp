// One run per run dir (issue 41, item 4): while a run trains, a second run given its run dir is refused in one line
// naming the first one's pid and host, before it touches a file there; the first run finishes as if alone; a later
// run continues the finished one; and a lock file left by a run that died locks nothing.
#include <gtest/gtest.h>
#include <torch/optim.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/train/loop.h"
#include "tandem/util/error.h"

namespace tandem::train::run_dir_lock {
namespace {

using testing::make_temp_dir;

// Two epochs of 4 steps; `max_steps` 4 stops after the first.
LoopOptions two_epochs_in(const std::string& run_dir, int64_t max_steps = 0) {
  LoopOptions options;
  options.epochs = 2;
  options.max_steps = max_steps;
  options.batch_size = 8;
  options.run_dir = run_dir;
  options.progress = false;
  options.report = false;
  options.tensorboard = false;
  return options;
}

// One process, no communicator: a run of its own. `on_run_start` runs once the run dir is chosen.
TrainResult train_in(const LoopOptions& options,
                     std::function<void(const std::string&, const std::string&)> on_run_start = nullptr) {
  torch::manual_seed(1);
  torch::nn::Linear net(8, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  Loop loop(options);
  loop.callbacks().on_run_start = std::move(on_run_start);
  return loop.fit(net, sgd, testing::separable_set(32, 1), nullptr);
}

std::string host_name() {
  char name[256] = {};
  EXPECT_EQ(::gethostname(name, sizeof name - 1), 0);
  return name;
}

TEST(RunDirLock, ASecondRunInTheSameRunDirIsRefusedNamingTheFirstOnesPidAndHost) {
  const std::string run_dir = make_temp_dir("run_dir_lock_second");
  std::promise<void> first_started, second_tried;
  std::future<void> tried = second_tried.get_future();
  auto first = std::async(std::launch::async, [&] {
    return train_in(two_epochs_in(run_dir, 4), [&](const std::string&, const std::string&) {
      first_started.set_value();
      tried.wait();  // the second run comes while this one holds the run dir
    });
  });
  first_started.get_future().wait();
  try {
    train_in(two_epochs_in(run_dir, 4));
    ADD_FAILURE() << "a second run trained in a run dir another run holds";
  } catch (const InvalidArgument& refused) {
    const std::string message = refused.what();
    EXPECT_NE(message.find("the run dir " + run_dir + " is in use by another run"), std::string::npos) << message;
    EXPECT_NE(message.find("pid " + std::to_string(::getpid()) + " on " + host_name()), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  second_tried.set_value();
  EXPECT_EQ(first.get().epochs.size(), 1u) << "the first run trains on undisturbed";
  EXPECT_EQ(checkpoint::list_checkpoints(run_dir),
            std::vector<std::string>{checkpoint::checkpoint_path(run_dir, 1, 0)});

  // Once it has ended, a later run continues it.
  const TrainResult continued = train_in(two_epochs_in(run_dir));
  ASSERT_EQ(continued.epochs.size(), 1u);
  EXPECT_EQ(continued.epochs.front().epoch, 1);
}

// A lock is the kernel's, not the file's: the file a killed run leaves behind, naming it, locks nothing.
TEST(RunDirLock, TheFileOfARunThatDiedDoesNotBlockTheNextRun) {
  const std::string run_dir = make_temp_dir("run_dir_lock_stale");
  std::ofstream(run_dir + "/.tandem-run-lock") << "pid 999999 on " << host_name() << "\n";
  EXPECT_EQ(train_in(two_epochs_in(run_dir, 4)).epochs.size(), 1u);
}

}  // namespace
}  // namespace tandem::train::run_dir_lock
