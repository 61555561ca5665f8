#pragma once
// Output paths checked before a run starts. A file that cannot be written is otherwise found out when it is
// written, at the end: a --save-weights into a missing folder failed after the last epoch, throwing the whole
// training away. The checks are early warnings, not guarantees: the folder may change before the write, which
// then reports its own error as before.
#include <string>

namespace tandem {

// `path` can be written the way write_file_atomically writes it (a temp file beside it, renamed over it): its
// folder exists and is writable, and `path` itself is not a folder. Throws InvalidArgument, one line starting
// with "`what` `path`:" that says what is wrong and what to do.
void require_writable_file(const std::string& what, const std::string& path);

// `path` is a writable folder, or std::filesystem::create_directories can make it one: the nearest part of it
// that exists is a writable folder. Throws InvalidArgument as above.
void require_creatable_folder(const std::string& what, const std::string& path);

}  // namespace tandem
