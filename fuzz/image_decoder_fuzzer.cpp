// read_image on arbitrary bytes: stb_image's decoders as tandem compiles them (src/data/stb_implementation.cpp)
// and the conversion to RGB. stb picks the decoder from the content, not the file name, so every format it
// knows is reachable from an image folder. A clean refusal is InvalidArgument; anything else escapes and
// libFuzzer reports it.
#include "fuzz/fuzz_input_file.h"
#include "tandem/data/image.h"
#include "tandem/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = tandem::fuzz::write_input_file(data, size);
  try {
    tandem::data::read_image(path);
  } catch (const tandem::InvalidArgument&) {
  }
  return 0;
}
