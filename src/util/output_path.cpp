#include "tandem/util/output_path.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tandem/util/error.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Why `folder` (which exists) cannot take new files, or "" if it can. access() asks the kernel, so it answers
// for this process's user, root included, and for a read-only file system.
std::string why_not_writable(const fs::path& folder) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) return folder.string() + " is not a folder";
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return fmt::format("cannot write into {} ({})", folder.string(), std::strerror(errno));
  }
  return "";
}

}  // namespace

void require_writable_file(const std::string& what, const std::string& path) {
  std::error_code error;
  const fs::path target = fs::absolute(path, error);
  if (fs::is_directory(target, error)) {
    throw InvalidArgument(fmt::format("{} {}: is a folder, not a file", what, path));
  }
  const fs::path folder = target.parent_path();
  if (!fs::exists(folder, error)) {
    throw InvalidArgument(fmt::format("{} {}: the folder {} does not exist; create it first or choose another file",
                                      what, path, folder.string()));
  }
  const std::string why = why_not_writable(folder);
  if (!why.empty()) throw InvalidArgument(fmt::format("{} {}: {}; choose another file", what, path, why));
}

void require_creatable_folder(const std::string& what, const std::string& path) {
  std::error_code error;
  fs::path existing = fs::absolute(path, error);
  while (!fs::exists(existing, error) && existing.has_relative_path()) existing = existing.parent_path();
  const std::string why = why_not_writable(existing);
  if (!why.empty()) throw InvalidArgument(fmt::format("{} {}: {}; choose another folder", what, path, why));
}

}  // namespace tandem
