#include "tandem/util/file_read_log.h"

#include "tandem/util/error.h"

namespace tandem {
namespace {

thread_local FileReadLog* active_log = nullptr;

}  // namespace

FileReadLog::FileReadLog() {
  TANDEM_CHECK(active_log == nullptr, "a FileReadLog is already logging this thread's reads");
  active_log = this;
}

FileReadLog::~FileReadLog() { active_log = nullptr; }

void FileReadLog::note_open(const std::string& path) {
  if (active_log) ++active_log->files_[path].opens;
}

void FileReadLog::note_read(const std::string& path, int64_t bytes) {
  if (active_log) active_log->files_[path].bytes += bytes;
}

}  // namespace tandem
