#pragma once
// What the calling thread reads through tandem's checkpoint readers (checkpoint/safetensors.h's SafetensorsReader and
// a sharded checkpoint's index), file by file: how often each was opened and how many bytes were read from it.
// Off, and free but for one thread-local check, unless a FileReadLog is alive on the thread. The scale tests
// count it per simulated rank (docs/checkpoint.md, "Sharded checkpoints at scale"): which files a rank opens, not
// how fast, is what grows with the world size.
#include <cstdint>
#include <map>
#include <string>

namespace tandem {

class FileReadLog {
 public:
  struct File {
    int opens = 0;
    int64_t bytes = 0;
  };

  // Logs this thread's reads from now until it is destroyed; logs do not nest.
  FileReadLog();
  ~FileReadLog();
  FileReadLog(const FileReadLog&) = delete;
  FileReadLog& operator=(const FileReadLog&) = delete;

  // By path, as the reader was given it.
  const std::map<std::string, File>& files() const { return files_; }

  // Called by the readers.
  static void note_open(const std::string& path);
  static void note_read(const std::string& path, int64_t bytes);

 private:
  std::map<std::string, File> files_;
};

}  // namespace tandem
