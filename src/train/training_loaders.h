#pragma once
// The loaders of a run: training in the DistributedSampler's shuffled order, evaluation in its plain order with
// every sample kept. Internal to the loop.
#include <cstdint>
#include <memory>
#include <optional>

#include "tandem/data/batch_loader.h"
#include "tandem/data/dataset.h"
#include "tandem/train/loop_options.h"

namespace tandem::train {

struct TrainingLoaders {
  std::unique_ptr<data::BatchLoader> train;
  std::unique_ptr<data::BatchLoader> eval;  // null without an evaluation set
  // The epoch's length, the same on every rank: rank 0's batches, which are the most under uneven inputs.
  int64_t batches_per_epoch = 0;
  // Rank 0's batches, to count them in an epoch continued from a position of its order (set_epoch).
  std::optional<data::BatchSampler> first_rank;
};

// Throws InvalidArgument when the training set holds less than one batch per rank.
TrainingLoaders make_training_loaders(const LoopOptions& options, int rank, int world_size,
                                      std::shared_ptr<const data::Dataset> train_set,
                                      std::shared_ptr<const data::Dataset> eval_set);

}  // namespace tandem::train
