// load_checkpoint on arbitrary bytes into a small model with SGD momentum: everything load_safetensors reads,
// then the metadata numbers, the strict match of model tensors and the momentum buffers. Each input gets a
// fresh model, as --resume restores into a model it just built, so that a finding replays on its own. A clean
// refusal is InvalidArgument; anything else escapes and libFuzzer reports it.
#include "fuzz/checkpoint_model.h"
#include "fuzz/fuzz_input_file.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::CheckpointModel target;
  const std::string& path = tandem::fuzz::write_input_file(data, size);
  try {
    tandem::checkpoint::load_checkpoint(path, *target.model, target.optimizer);
  } catch (const tandem::InvalidArgument&) {
  }
  return 0;
}
