#pragma once
// A PyTorch optimizer's state continued in LibTorch's (`tandem train --init DCP --init-optimizer`): the layout of
// `torch.distributed.checkpoint.state_dict.get_state_dict` as a distributed checkpoint flattens it, each
// parameter's `optimizer.state.<name>.<field>` (`exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`, `momentum_buffer`,
// `square_avg`, `grad_avg`, `step`) and the group's `optimizer.param_groups.0.<key>` (betas, eps, weight_decay,
// momentum, ...), whole on every rank (read_distributed_checkpoint puts each together); fsdp then cuts its shards of
// it as it does of any state.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// What import_optimizer_state found, for the log.
struct ImportedOptimizerState {
  std::string optimizer;  // "AdamW", ...
  int64_t step = 0;       // the first parameter's step count (PyTorch keeps one per parameter)
  int64_t parameters = 0;
};

// Gives every parameter of `optimizer`'s (single) group, named as in `module`, the state `saved` holds for it.
// Refused in one line (InvalidArgument naming `source`) before anything changes: another kind of optimizer, another
// hyper-parameter than the run's (the learning rate excepted: it is the run's schedule's, as when any checkpoint is
// continued), more than one param group, `maximize`, a parameter without state or with state of another shape.
ImportedOptimizerState import_optimizer_state(const TensorFile& saved, const torch::nn::Module& module,
                                              torch::optim::Optimizer& optimizer, const std::string& source);

}  // namespace tandem::checkpoint
