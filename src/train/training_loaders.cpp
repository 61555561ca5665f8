#include "training_loaders.h"

#include <fmt/format.h>

#include "tandem/data/distributed_sampler.h"
#include "tandem/util/error.h"

namespace tandem::train {

TrainingLoaders make_training_loaders(const LoopOptions& options, int rank, int world_size,
                                      std::shared_ptr<const data::Dataset> train_set,
                                      std::shared_ptr<const data::Dataset> eval_set) {
  const data::BatchLoaderOptions loading{options.prefetch_batches, options.device};
  data::DistributedSamplerOptions train_sampling{world_size, rank, options.shuffle, options.seed, false};
  train_sampling.uneven = options.uneven_inputs;
  // Uneven inputs train every sample once, so no rank drops its partial last batch; a last batch of one sample
  // joins the one before it, where BatchNorm could not train on it alone.
  const bool drop_last = options.drop_last && !options.uneven_inputs;
  const data::SingleSampleTail tail =
      options.uneven_inputs ? data::SingleSampleTail::kMergeIntoPrevious : data::SingleSampleTail::kKeep;
  const auto train_batches = [&](const data::DistributedSamplerOptions& sampling) {
    return data::BatchSampler(data::DistributedSampler(train_set->size(), sampling), options.batch_size, drop_last,
                              tail);
  };
  TrainingLoaders loaders;
  loaders.train = std::make_unique<data::BatchLoader>(train_set, train_batches(train_sampling), loading);
  if (eval_set) {
    const data::DistributedSamplerOptions eval_sampling{world_size, rank, false, options.seed, false};
    loaders.eval = std::make_unique<data::BatchLoader>(
        eval_set,
        data::BatchSampler(data::DistributedSampler(eval_set->size(), eval_sampling), options.batch_size,
                           /*drop_last=*/false),
        loading);
  }
  data::DistributedSamplerOptions first_rank = train_sampling;
  first_rank.rank = 0;
  loaders.first_rank.emplace(train_batches(first_rank));
  loaders.batches_per_epoch = loaders.first_rank->num_batches();
  if (loaders.batches_per_epoch == 0) {
    throw InvalidArgument(fmt::format("the training set has {} samples: fewer than one batch of {} per rank over {} ranks",
                                      train_set->size(), options.batch_size, world_size));
  }
  return loaders;
}

}  // namespace tandem::train
