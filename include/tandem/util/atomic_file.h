#pragma once
// Files that a crash must never leave half written (checkpoints, traces, reports): readers see the old file or
// the new one, whole.
#include <cstddef>
#include <functional>
#include <string>

namespace tandem {

// Appends bytes to the file being written; throws Error naming it when the write fails.
using FileAppender = std::function<void(const void* data, size_t size)>;

// Calls `write` with an appender to PATH.tmp.<pid>, fsyncs that file, renames it over `path` and fsyncs the
// directory, so that a caller told "written" can rely on it. Throws Error naming the file on any failure,
// leaving `path` as it was and no temp file behind.
void write_file_atomically(const std::string& path, const std::function<void(const FileAppender& append)>& write);
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace tandem
