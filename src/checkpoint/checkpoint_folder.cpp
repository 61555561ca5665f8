#include "tandem/checkpoint/checkpoint_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "sharded_index.h"
#include "tandem/checkpoint/checkpoint_damage.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;

// The parts other than the main file (index, rank files, their temp files) that lie beside the checkpoint at
// `checkpoint_path`, as paths.
std::vector<std::string> sharded_checkpoint_parts(const std::string& checkpoint_path) {
  const std::string name = fs::path(checkpoint_path).filename().string();
  const std::string folder = folder_of_checkpoint(checkpoint_path);
  std::vector<std::string> parts;
  for (const std::string& entry : folder_entries(folder)) {
    if (checkpoint_of_part(entry) == name) parts.push_back(folder + "/" + entry);
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::vector<std::string> folder_entries(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  // A folder that is not there holds nothing. One that cannot be read now (too many open files, an I/O error)
  // must not pass for empty: a run dir would look as if it held no checkpoint, and the run would start over.
  if (error && error != std::errc::no_such_file_or_directory && error != std::errc::not_a_directory) {
    throw Error(fmt::format("cannot list the folder {}: {}", folder, error.message()));
  }
  return names;
}

std::string checkpoint_path(const std::string& run_dir, int epoch, int64_t batches_done) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%04d-%08lld.safetensors", epoch, static_cast<long long>(batches_done));
  return run_dir + "/" + name;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  // Training order is (epoch, batch) read as numbers: the zero padding is only as wide as checkpoint_path makes
  // it, and a name written by hand may have none, so "10" must not sort before "9". The name breaks ties.
  std::vector<std::tuple<int, long long, std::string>> found;
  for (std::string& name : folder_entries(run_dir)) {
    int epoch = 0;
    long long batches = 0;
    char tail[32] = {0};
    // Exactly checkpoint-EEEE-BBBBBBBB.safetensors; temp files carry a ".tmp.<pid>" suffix and fail the match.
    if (std::sscanf(name.c_str(), "checkpoint-%d-%lld.%31s", &epoch, &batches, tail) == 3 &&
        std::string(tail) == "safetensors") {
      found.emplace_back(epoch, batches, std::move(name));
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (const auto& entry : found) paths.push_back(run_dir + "/" + std::get<2>(entry));
  return paths;
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  std::vector<std::string> checkpoints = list_checkpoints(run_dir);
  if (checkpoints.empty()) return std::nullopt;
  return checkpoints.back();
}

std::optional<std::string> find_latest_intact_checkpoint(const std::string& run_dir) {
  const std::vector<std::string> checkpoints = list_checkpoints(run_dir);
  std::vector<std::pair<std::string, std::string>> damaged;  // path, what is wrong with it; newest first
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    std::string damage = checkpoint_damage(*it);
    if (!damage.empty()) {
      damaged.emplace_back(*it, std::move(damage));
      continue;
    }
    for (const auto& [path, what] : damaged) {
      std::error_code error;
      fs::rename(path, path + ".damaged", error);
      if (error) throw Error("cannot move the damaged checkpoint " + path + " aside: " + error.message());
      for (const std::string& part : sharded_checkpoint_parts(path)) fs::rename(part, part + ".damaged", error);
      log::main_info("skipping a damaged checkpoint: {}; moved it to {}.damaged, continuing from {}", what, path, *it);
    }
    return *it;
  }
  if (damaged.empty()) return std::nullopt;
  throw InvalidArgument(fmt::format("every checkpoint in {} is damaged (the newest: {}); start a new run in another "
                                    "`run_dir`",
                                    run_dir, damaged.front().second));
}

void remove_unfinished_checkpoints(const std::string& run_dir) {
  for (const std::string& name : folder_entries(run_dir)) {
    // A sharded checkpoint's part whose checkpoint file never came (or was pruned before it) is unfinished too.
    const std::string part_of = checkpoint_of_part(name);
    const bool orphan = !part_of.empty() && !fs::exists(run_dir + "/" + part_of);
    if (orphan || (name.rfind("checkpoint-", 0) == 0 && name.find(".tmp.") != std::string::npos)) {
      std::error_code ignored;  // another cleanup may have won the race; what matters is that it is gone
      fs::remove(run_dir + "/" + name, ignored);
    }
  }
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  if (keep <= 0) return;
  const std::vector<std::string> checkpoints = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < checkpoints.size(); ++i) {
    std::error_code error;
    // The checkpoint file first: parts left by a crash here are orphans, which the next start removes.
    fs::remove(checkpoints[i], error);
    if (error) throw Error("cannot remove the old checkpoint " + checkpoints[i] + ": " + error.message());
    for (const std::string& part : sharded_checkpoint_parts(checkpoints[i])) {
      fs::remove(part, error);
      if (error) throw Error("cannot remove the old checkpoint's file " + part + ": " + error.message());
    }
  }
}

}  // namespace tandem::checkpoint
