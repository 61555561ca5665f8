#include "run_dir_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

constexpr const char* kLockName = ".tandem-run-lock";

// What the holder wrote: "pid P on HOST", or a note when it has not written yet (it locks, then writes).
std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "a run that has not written its pid and host yet" : holder;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir, const std::string& host) {
  const std::string path = run_dir + "/" + kLockName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(fmt::format("cannot open the run dir's lock {}: {}", path, std::strerror(errno)));
  int result;
  do {
    result = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result == 0) {
    const std::string holder = fmt::format("pid {} on {}\n", ::getpid(), host);
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, holder.data(), holder.size(), 0) < 0) {
      log::main_info("cannot write this run's pid into {} ({}): a second run would not learn who holds it", path,
                     std::strerror(errno));
    }
    return;
  }
  const int error = errno;
  if (error == EWOULDBLOCK) {
    const std::string holder = holder_of(fd_);
    ::close(fd_);
    throw InvalidArgument(fmt::format("the run dir {} is in use by another run ({}, which holds {}): two runs in one "
                                      "`run_dir` would overwrite each other's checkpoints and records; wait for it "
                                      "to end, or give this run another `run_dir`",
                                      run_dir, holder, path));
  }
  // ENOLCK, EOPNOTSUPP, ENOSYS: a file system without locks, where refusing would stop every run on it.
  ::close(fd_);
  fd_ = -1;
  log::main_info("cannot lock the run dir {} ({}): its file system does not lock files, so a second run in it would "
                 "not be refused",
                 run_dir, std::strerror(error));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, naming the last holder, and locks again
}

}  // namespace tandem::train
