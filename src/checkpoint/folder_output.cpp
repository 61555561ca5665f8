// Folders written as one (folder_output.h).
#include "folder_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tandem/util/error.h"

namespace tandem::checkpoint {

void FolderOutput::require_absent(const std::string& dir) {
  std::error_code error;
  if (std::filesystem::symlink_status(dir, error).type() != std::filesystem::file_type::not_found) {
    throw InvalidArgument(dir + " exists already: it is never overwritten; name a new folder, or move it away");
  }
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
    throw InvalidArgument(dir + ": its folder " + parent.string() + " does not exist; create it first");
  }
}

FolderOutput::FolderOutput(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  require_absent(dir_);
  std::error_code error;
  temp_ = dir_ + ".tmp." + std::to_string(::getpid());
  std::filesystem::remove_all(temp_, error);
  if (!std::filesystem::create_directory(temp_, error)) {
    throw Error("cannot create " + temp_ + ": " + error.message());
  }
}

FolderOutput::~FolderOutput() {
  if (published_) return;
  std::error_code ignored;
  std::filesystem::remove_all(temp_, ignored);
}

void FolderOutput::publish() {
  // rename() of a folder onto a path that appeared meanwhile fails only when that one is a non-empty folder;
  // the check in the constructor and this one leave a file or an empty folder made in between the only loss.
  std::error_code error;
  if (std::filesystem::symlink_status(dir_, error).type() != std::filesystem::file_type::not_found) {
    throw InvalidArgument(dir_ + " appeared while it was being written: it is left as it is, and nothing was "
                          "written; name a new folder");
  }
  if (::rename(temp_.c_str(), dir_.c_str()) != 0) {
    throw Error("cannot rename " + temp_ + " to " + dir_ + ": " + std::strerror(errno));
  }
  published_ = true;
  std::filesystem::path parent = std::filesystem::path(dir_).parent_path();
  if (parent.empty()) parent = ".";
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace tandem::checkpoint
