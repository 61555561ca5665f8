// read_idx_file on arbitrary bytes: plain IDX headers and data, and through the gzip path (inflate, the size
// limit taken from the header as it arrives, several gzip members) whenever the input starts with gzip's magic.
// A clean refusal is InvalidArgument; anything else escapes and libFuzzer reports it.
#include "fuzz/fuzz_input_file.h"
#include "tandem/data/idx_file.h"
#include "tandem/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = tandem::fuzz::write_input_file(data, size);
  try {
    tandem::data::read_idx_file(path);
  } catch (const tandem::InvalidArgument&) {
  }
  return 0;
}
