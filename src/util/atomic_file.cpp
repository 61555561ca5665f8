#include "tandem/util/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/util/error.h"

namespace tandem {
namespace {

// Returns false with errno set when a write fails.
bool write_all(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_symbolic_link(const std::string& path) {
  struct stat status {};
  return ::lstat(path.c_str(), &status) == 0 && S_ISLNK(status.st_mode);
}

[[noreturn]] void throw_symbolic_link(const std::string& path) {
  throw Error("cannot write " + path + ": it is a symbolic link, which tandem never writes through (one planted in "
              "a shared folder would redirect the write); remove it, or write somewhere else");
}

// Creates `temp` for writing, refusing a link in its place. A regular file there is the temp file of a killed
// process that had this pid (pids repeat, in containers especially): it is removed and the creation retried.
int create_temp_file(const std::string& temp) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(temp.c_str(), kFlags, 0644);
  if (fd < 0 && errno == EEXIST) {
    if (is_symbolic_link(temp)) throw_symbolic_link(temp);
    if (::unlink(temp.c_str()) == 0) fd = ::open(temp.c_str(), kFlags, 0644);
  }
  return fd;
}

}  // namespace

void refuse_symbolic_link(const std::string& path) {
  if (is_symbolic_link(path)) throw_symbolic_link(path);
}

void write_file_atomically(const std::string& path, const std::function<void(const FileAppender& append)>& write) {
  // rename() would replace a link rather than follow it; refusing it says what is going on instead.
  refuse_symbolic_link(path);
  // Every failure names the file the caller asked for first, then the step that failed.
  const auto throw_io = [&](const std::string& failed_step) {
    throw Error("cannot write " + path + ": " + failed_step + ": " + std::strerror(errno));
  };
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  int fd = create_temp_file(temp);
  if (fd < 0) throw_io("cannot create " + temp);
  try {
    write([&](const void* data, size_t size) {
      if (!write_all(fd, data, size)) throw_io("cannot write " + temp);
    });
    if (::fsync(fd) != 0) throw_io("cannot fsync " + temp);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw_io("cannot close " + temp);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    throw_io("cannot rename " + temp + " over it");
  }
  // The rename itself is durable only once the directory entry is on disk. File systems that cannot sync a
  // directory at all say EINVAL, and there is nothing more to do.
  const std::string dir_path = parent_dir(path);
  const int dir = ::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) throw_io("cannot open its directory " + dir_path + " to fsync it");
  const bool synced = ::fsync(dir) == 0 || errno == EINVAL;
  const int fsync_errno = errno;
  ::close(dir);
  errno = fsync_errno;
  if (!synced) throw_io("cannot fsync directory " + dir_path);
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  write_file_atomically(path, [&](const FileAppender& append) { append(contents.data(), contents.size()); });
}

std::FILE* open_for_appending(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  // O_NOFOLLOW's refusal of a link is ELOOP.
  if (fd < 0 && errno == ELOOP && is_symbolic_link(path)) throw_symbolic_link(path);
  if (fd < 0) throw Error("cannot open " + path + " for appending: " + std::strerror(errno));
  std::FILE* file = ::fdopen(fd, "a");
  if (!file) {
    const int fdopen_errno = errno;
    ::close(fd);
    throw Error("cannot open " + path + " for appending: " + std::strerror(fdopen_errno));
  }
  return file;
}

}  // namespace tandem
