// The Run's in-job recovery (train/run.h, docs/recovery.md): a change of membership inside an epoch, and a
// replacement's start. Both end with every member on the new membership's communicator, at the newest step any
// member completed, the model re-wrapped over that communicator and the loaders cut for the new world size.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "run.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/util/error.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

// The healing member's run dir, for a replacement, which met nobody when the run dir was chosen.
constexpr const char* kRunDirValue = "recovery.run_dir";

// Where a member's state is serialised before it goes over the communicator, and received before it loads: a
// folder of this process's own in memory (/dev/shm) where the machine has one, else TMPDIR.
class StateFile {
 public:
  StateFile() {
    std::error_code error;
    const std::filesystem::path memory = "/dev/shm";
    const std::filesystem::path folder =
        std::filesystem::is_directory(memory, error) ? memory : std::filesystem::temp_directory_path();
    path_ = (folder / fmt::format("tandem-heal-{}.safetensors", ::getpid())).string();
  }
  ~StateFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  const std::string& path() const { return path_; }
  torch::Tensor read() const {
    std::ifstream in(path_, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
  }
  void write(const torch::Tensor& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
    if (!out.flush()) throw Error(fmt::format("cannot keep the state received from a peer in {}", path_));
  }

 private:
  std::string path_;
};

}  // namespace

void Run::use_communicator(comm::CommunicatorPtr communicator) {
  communicator_ptr_ = std::move(communicator);
  communicator_ = communicator_ptr_.get();
  rank_ = communicator_->rank();
  world_ = communicator_->world_size();
  is_main_ = rank_ == 0;
  scaler_.set_communicator(communicator_ptr_);
}

// After a failed collective, or a step at which the launcher announced a membership: the epoch goes on from the
// position its completed batches reach, which holds on any world size, with loaders cut for the new world, so
// that no sample is trained twice or left out.
void Run::change_membership(int epoch, EpochProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const int old_world = world_;
  progress.first_position = position_done(progress);
  progress.first_batch = progress.batches_done;
  form_next_membership([&] {
    if (std::optional<checkpoint::CheckpointState> healed = heal(epoch, progress)) {
      progress = progress_of(*healed, healed->sample_position);
    }
  });
  make_loaders();
  log::main_info("membership epoch {}: slots {} go on as {} rank{} (from {}) at step {}, sample {} of epoch's order; "
                 "changed in {:.3f} s",
                 membership_->epoch(), comm::format_slots(membership_->members()), world_, world_ == 1 ? "" : "s",
                 old_world, step_, progress.first_position,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// A replacement's start, instead of the run dir's and a checkpoint's: it says it is ready, waits to be taken in,
// and continues as a resumed run would, from the state a member sent it. False when the members ended the run
// first: nothing is left to train.
bool Run::be_taken_in() {
  module_.to(options_.device);
  membership_->announce_ready();
  const bool taken_in = form_next_membership([&] {
    std::optional<checkpoint::CheckpointState> healed = heal(0, {});
    if (!healed) throw InternalError("a replacement was taken in without the members' state");
    resumed_ = *healed;
    resumed_position_ = healed->sample_position;
  });
  if (!taken_in) {
    log::info("slot {}: the members ended the run before this replacement was taken in; nothing is left to train",
              membership_->slot());
    return false;
  }
  joined_in_epoch_ = true;
  log::info("taken in as rank {} of {} (slot {}) at step {}", rank_, world_, membership_->slot(), step_);
  return true;
}

// The next membership's communicator, `heal` (every member at the newest step), then the model wrapped over the
// communicator (DDP's wrapper checks that every rank holds the same model, and broadcasts rank 0's) and the
// learning rate scaled to the new global batch. A member lost meanwhile (the one sending the state, say) fails a
// collective of this membership too: the members go on to the launcher's next one, and heal again there.
bool Run::form_next_membership(const std::function<void()>& heal) {
  while (true) {
    // Its own failures (no launcher's decision in time, this worker counted lost) end the run.
    if (!membership_->advance()) return false;
    use_communicator(membership_->communicator());
    try {
      heal();
      strategy_->wrap({options_, model_, optimizer_, communicator_ptr_});
      scale_base_lrs();
      return true;
    } catch (const CommError& error) {
      log::warn("a collective failed while the membership changed ({}); going on with the ranks that are left",
                first_line(error.what()));
    }
  }
}

// Collective on the new communicator. The members' steps are gathered: a member whose step's last collective
// failed while another's completed is one step behind, and a replacement holds nothing. Where any is behind,
// the first member at the newest step sends its whole state (the model, the optimizer, the scaler, the schedule,
// the epoch's position and the callbacks' extra state); those behind load it and get it back, the others ignore
// it. Nothing is read from disk.
std::optional<checkpoint::CheckpointState> Run::heal(int epoch, const EpochProgress& progress) {
  const int64_t mine = holds_state_ ? step_ : -1;
  std::vector<torch::Tensor> steps;
  for (int r = 0; r < world_; ++r) steps.push_back(torch::empty({1}, torch::kInt64));
  communicator_->all_gather(steps, torch::full({1}, mine, torch::kInt64))->wait();
  // The source is the last member at the newest step: rank 0 has the run's records and checkpoints to write, and
  // its loss ends in a restart, where another source's loss is recovered in the job like any other.
  int64_t newest = -1, oldest = std::numeric_limits<int64_t>::max();
  int source = 0;
  for (int r = 0; r < world_; ++r) {
    const int64_t step = steps[static_cast<size_t>(r)].item<int64_t>();
    oldest = std::min(oldest, step);
    if (step >= newest) {
      newest = step;
      source = r;
    }
  }
  const bool anyone_behind = oldest < newest;
  if (newest < 0) throw Error("no member of the new membership holds the training state; restart from a checkpoint");
  if (!anyone_behind) return std::nullopt;

  StateFile file;
  torch::Tensor size = torch::zeros({1}, torch::kInt64);
  torch::Tensor bytes;
  if (rank_ == source) {
    checkpoint::ExtraState extra = callbacks_.save_extra ? callbacks_.save_extra() : checkpoint::ExtraState{};
    extra.values[kRunDirValue] = options_.run_dir;
    // The epoch and progress the source stands at: a change of membership rebased its progress, so its position
    // is where every member goes on.
    checkpoint::save_checkpoint(file.path(), module_, optimizer_, checkpoint_state(epoch, progress), extra);
    bytes = file.read();
    size.fill_(bytes.numel());
  }
  communicator_->broadcast(size, source)->wait();
  if (rank_ == source) fault::kill_point("heal-send", ++heals_sent_);
  if (rank_ != source) bytes = torch::empty({size.item<int64_t>()}, torch::kUInt8);
  communicator_->broadcast(bytes, source)->wait();
  if (mine == newest) return std::nullopt;

  file.write(bytes);
  checkpoint::ExtraState extra;
  checkpoint::CheckpointState state = checkpoint::load_checkpoint(file.path(), module_, optimizer_, &extra);
  step_ = state.step;
  initial_batch_size_ = state.initial_batch_size;
  initial_accumulate_batches_ = state.initial_accumulate_batches;
  if (scaler_.is_enabled() && state.grad_scaler) scaler_.load_state_dict(*state.grad_scaler);
  if (callbacks_.load_extra) callbacks_.load_extra(extra);
  options_.run_dir = extra.values[kRunDirValue];
  // A stream of its own for what the model draws (dropout): the one this slot had is gone with its process.
  torch::manual_seed(options_.seed + 7919 * static_cast<uint64_t>(membership_->slot()) + static_cast<uint64_t>(step_));
  holds_state_ = true;
  return state;
}

}  // namespace tandem::train
