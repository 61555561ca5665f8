#pragma once
// How tandem writes its own files (checkpoints, records, traces, reports). A crash must never leave one half
// written: readers see the old file or the new one, whole. And none is ever written through a symbolic link:
// a run dir may sit in a shared writable folder, where a link planted under a name tandem is about to write
// would redirect the write to any file the user can write.
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>

namespace tandem {

// Appends bytes to the file being written; throws Error naming it when the write fails.
using FileAppender = std::function<void(const void* data, size_t size)>;

// Creates PATH.tmp.<pid> (O_EXCL | O_NOFOLLOW: a link in its place is refused, not followed), calls `write` with
// an appender to it, fsyncs it, renames it over `path` and fsyncs the directory, so that a caller told "written"
// can rely on it. A symbolic link at `path` itself is refused rather than silently replaced. Throws Error naming
// the file on any failure, leaving `path` as it was and no temp file behind.
void write_file_atomically(const std::string& path, const std::function<void(const FileAppender& append)>& write);
void write_file_atomically(const std::string& path, const std::string& contents);

// Opens `path` for appending, creating it (mode 0644 less the umask) if missing, without following a symbolic
// link in its place (O_NOFOLLOW). Throws Error naming the file, in one line, when it cannot be opened or is a link.
std::FILE* open_for_appending(const std::string& path);

// Throws Error naming `path` when it is a symbolic link (whether or not its target exists); `path` missing is fine.
void refuse_symbolic_link(const std::string& path);

}  // namespace tandem
