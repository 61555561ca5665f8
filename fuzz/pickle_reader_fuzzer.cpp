// PyTorch's checkpoint pickles on arbitrary bytes (fuzz/pickle_reader.h): the pickle reader's opcodes, memo and
// marks, DCP's metadata classes, the zip of a torch.save archive and the tensor rebuilt from it. A clean refusal is
// InvalidArgument; anything else escapes and libFuzzer reports it.
#include "fuzz/pickle_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::read_pytorch_pickles(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
