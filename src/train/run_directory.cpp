#include "tandem/train/run_directory.h"

#include <ctime>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

// Orders names as text, except that runs of digits compare as the numbers they spell, so that the run
// 20240501-120000-10 comes after 20240501-120000-9 (and after 20240501-120000). Leading zeros are skipped and
// digits compared as text, so numbers of any length compare without overflowing.
bool numbers_aware_less(const std::string& a, const std::string& b) {
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (!is_digit(a[i]) || !is_digit(b[j])) {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
      continue;
    }
    size_t a_end = i, b_end = j;
    while (a_end < a.size() && is_digit(a[a_end])) ++a_end;
    while (b_end < b.size() && is_digit(b[b_end])) ++b_end;
    while (i + 1 < a_end && a[i] == '0') ++i;
    while (j + 1 < b_end && b[j] == '0') ++j;
    const std::string_view a_number(a.data() + i, a_end - i), b_number(b.data() + j, b_end - j);
    if (a_number.size() != b_number.size()) return a_number.size() < b_number.size();
    if (a_number != b_number) return a_number < b_number;
    i = a_end, j = b_end;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

void check_run_outputs(const LoopOptions& options) {
  if (!options.timeline_path.empty()) require_writable_file("`timeline_path`", options.timeline_path);
  // Without a run dir, rank 0 makes (or with `resume` finds) runs/<timestamp> in the working folder.
  if (options.run_dir.empty()) {
    require_creatable_folder("the runs folder (`run_dir` to choose another)", "runs");
    return;
  }
  require_creatable_folder("`run_dir`", options.run_dir);
  if (options.report && fs::is_directory(options.run_dir)) {
    require_writable_file("the report", options.run_dir + "/report.html");
  }
}

std::string timestamped_run_dir(const std::string& runs_dir) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  const std::string base = runs_dir + "/" + stamp;
  std::string dir = base;
  std::error_code error;
  for (int i = 1; fs::exists(dir, error); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

std::string newest_run_dir(const std::string& runs_dir) {
  std::string best;
  for (const std::string& name : checkpoint::folder_entries(runs_dir)) {
    if ((best.empty() || numbers_aware_less(best, name)) && checkpoint::find_latest_checkpoint(runs_dir + "/" + name)) {
      best = name;
    }
  }
  return best.empty() ? "" : runs_dir + "/" + best;
}

}  // namespace tandem::train
