#pragma once
// Moved to tandem/checkpoint/safetensors.h (the format) and tandem/checkpoint/weights.h (weights files), namespace
// tandem::checkpoint. This header and these names in tandem::train keep programs written against the earlier
// layout compiling for one release; they go in the next.
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"

namespace tandem::train {
using checkpoint::load_safetensors;
using checkpoint::load_weights;
using checkpoint::LoadReport;
using checkpoint::named_state;
using checkpoint::save_safetensors;
using checkpoint::save_weights;
using checkpoint::SafetensorsReader;
using checkpoint::TensorEntry;
using checkpoint::TensorFile;
}  // namespace tandem::train
