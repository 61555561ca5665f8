#pragma once
// Moved to tandem/checkpoint/rng_state.h (namespace tandem::checkpoint). This header and these names in
// tandem::train keep programs written against the earlier layout compiling for one release; they go in the next.
#include "tandem/checkpoint/rng_state.h"

namespace tandem::train {
using checkpoint::capture_generators;
using checkpoint::continue_rng_states;
using checkpoint::gather_rng_states;
using checkpoint::generator_devices;
using checkpoint::new_rank_seed;
using checkpoint::restore_generators;
using checkpoint::restore_rng_states;
using checkpoint::RngStates;
}  // namespace tandem::train
