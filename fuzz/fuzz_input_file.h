#pragma once
// The readers under fuzz take a path, not bytes, so each input reaches them through a file: one file per
// fuzzing process, in a private folder made under $TMPDIR on first use (scripts/fuzz points TMPDIR into the
// fuzz build folder), overwritten for every input. A run that ends in a crash leaves the folder behind.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

inline const std::string& write_input_file(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string folder = std::string(tmp && *tmp ? tmp : "/tmp") + "/tandem-fuzz-XXXXXX";
    if (!::mkdtemp(folder.data())) {
      std::perror(("cannot create " + folder).c_str());
      std::abort();
    }
    static const std::string file = folder + "/input";
    static const std::string dir = folder;
    std::atexit([] {
      std::remove(file.c_str());
      ::rmdir(dir.c_str());
    });
    return file;
  }();
  // A short write would fuzz a different input than the one libFuzzer saves, so it stops the run.
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (!out || std::fwrite(data, 1, size, out) != size || std::fclose(out) != 0) {
    std::perror(("cannot write " + path).c_str());
    std::abort();
  }
  return path;
}

}  // namespace tandem::fuzz
