#pragma once
// What rank 0 of `tandem train` prints at a run's start: the resolved configuration, one `key: value` line each.
#include <string>

#include "apps/program/training_program.h"

namespace tandem::app {

// `checkpoint`: the one the run continues from, empty for a new run.
std::string describe_configuration(const TrainingProgramOptions& program, const data::DataFolder& data,
                                   int world_size, const std::string& checkpoint);

}  // namespace tandem::app
