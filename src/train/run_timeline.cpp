#include "tandem/train/run_timeline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "tandem/comm/rank_agreement.h"
#include "tandem/monitor/timeline_trace.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::train {

RunTimeline::RunTimeline(std::string trace_path, monitor::StepWindow window, std::string run_dir,
                         comm::Communicator* communicator, ddp::Reducer* reducer)
    : trace_path_(std::move(trace_path)),
      run_dir_(std::move(run_dir)),
      communicator_(communicator),
      reducer_(reducer),
      timeline_(window) {
  const bool is_main = !communicator_ || communicator_->rank() == 0;
  comm::run_on_all_ranks(communicator_, "to prepare the timeline", [&] {
    if (!is_main) return;
    const std::filesystem::path folder = std::filesystem::absolute(trace_path_).parent_path();
    if (!std::filesystem::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0) {
      throw InvalidArgument(fmt::format("`timeline_path` {}: cannot write into {}; create it or choose another file",
                                        trace_path_, folder.string()));
    }
  });
  // Every rank's clock starts where a barrier returned, so that the ranks' lanes line up in the trace.
  if (communicator_) communicator_->barrier()->wait();
  timeline_.set_origin(monitor::TimelineClock::now());
  if (reducer_) reducer_->set_timeline(&timeline_);
}

void RunTimeline::after_step(int64_t steps_done) {
  if (timeline_.finished() && !written_) write(steps_done);
}

void RunTimeline::finish(int64_t steps_done) {
  if (!written_) write(steps_done);
}

// Collective: at the same step on every rank, since the window and the step count are the same everywhere.
void RunTimeline::write(int64_t steps_done) {
  written_ = true;
  if (reducer_) reducer_->set_timeline(nullptr);
  const std::vector<std::vector<monitor::Span>> spans = monitor::gather_timelines(communicator_, timeline_);
  const bool is_main = !communicator_ || communicator_->rank() == 0;
  comm::run_on_all_ranks(communicator_, "to write the timeline", [&] {
    if (!is_main) return;
    const monitor::StepWindow& window = timeline_.window();
    monitor::TimelineSummary summary{trace_path_, window.first, window.last,
                                     communicator_ ? communicator_->world_size() : 1, {}};
    for (size_t rank = 0; rank < spans.size(); ++rank) {
      summary.ranks.push_back(monitor::summarize_timeline(spans[rank], static_cast<int>(rank)));
    }
    write_file_atomically(trace_path_, monitor::chrome_trace_json(spans));
    write_file_atomically(run_dir_ + "/timeline_summary.json", monitor::to_json(summary));
    if (summary.ranks.empty() || summary.ranks[0].steps == 0) {
      log::main_info("timeline: the run had no step in {}-{}; {} holds no steps", window.first, window.last,
                     trace_path_);
    } else {
      log::main_info("timeline of steps {}-{} written to {} ({:.0f}% of rank 0's all-reduce time hidden behind "
                     "backward)",
                     window.first, std::min(window.last, steps_done), trace_path_,
                     100 * summary.ranks[0].hidden_share());
    }
  });
}

}  // namespace tandem::train
