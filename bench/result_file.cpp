#include "bench/result_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tandem/util/error.h"

namespace tandem::bench {

void check_result_file_writable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) {
    throw InvalidArgument(fmt::format("--json {} is a folder; give the path of a file to write", path));
  }
  if (fs::exists(path, error)) {
    if (::access(path.c_str(), W_OK) != 0) {
      throw InvalidArgument(fmt::format("--json {} cannot be overwritten ({}); give another path", path,
                                        std::strerror(errno)));
    }
    return;
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(folder, error)) {
    throw InvalidArgument(
        fmt::format("--json {}: folder {} does not exist; create it or give another path", path, folder));
  }
  // access() also answers for a read-only file system, which the folder's permission bits do not show.
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw InvalidArgument(fmt::format("--json {}: folder {} is not writable ({}); give another path", path, folder,
                                      std::strerror(errno)));
  }
}

void write_result_file(const std::string& path, const nlohmann::json& results) {
  std::ofstream file(path);
  file << results.dump(2) << "\n";
  file.close();
  if (!file) throw Error(fmt::format("could not write the results to --json {}", path));
}

}  // namespace tandem::bench
