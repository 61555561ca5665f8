// load_safetensors on arbitrary bytes: the header length, the JSON header, each entry's dtype, shape and byte
// range, and the tensor reads. A clean refusal is InvalidArgument; anything else escapes and libFuzzer reports it.
#include "fuzz/fuzz_input_file.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = tandem::fuzz::write_input_file(data, size);
  try {
    tandem::checkpoint::load_safetensors(path);
  } catch (const tandem::InvalidArgument&) {
  }
  return 0;
}
