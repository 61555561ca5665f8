#include "tandem/fsdp/sharded_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "tandem/fsdp/unit_plan.h"
#include "tandem/util/error.h"

namespace tandem::fsdp {

using parameter_use_watch::Pause;

ShardedModel::ShardedModel(torch::nn::Module& module, comm::CommunicatorPtr communicator, FsdpOptions options)
    : communicator_(std::move(communicator)), options_(std::move(options)) {
  Pause pause;
  comm::Communicator* comm = communicator_.get();
  const MixedPrecision& precision = options_.mixed_precision;
  require_supported(precision, comm);
  const bool low_precision = precision.param_dtype != torch::kFloat32;
  std::vector<UnitSpec> specs =
      plan_units(module, options_.units, low_precision ? precision.float32_module_types : std::vector<std::string>{});
  std::vector<torch::Tensor> buffers = module.buffers();
  if (!buffers.empty()) {
    buffers_ = std::make_unique<ddp::CoalescedBroadcaster>(std::move(buffers));
    if (comm && comm->world_size() > 1) buffers_->broadcast(*comm);
  }
  nested_in_ = unit_nesting(specs);
  for (UnitSpec& spec : specs) {
    const bool float32 = spec.keeps_float32;
    units_.push_back(std::make_unique<FlatUnit>(std::move(spec), comm,
                                                float32 ? torch::kFloat32 : precision.param_dtype,
                                                float32 ? torch::kFloat32 : precision.reduce_dtype_or_param()));
  }
  const int unit_count = static_cast<int>(units_.size());
  ready_.resize(unit_count);
  used_since_sync_.resize(unit_count);
  unused_elements_.resize(unit_count);
  for (int unit = 0; unit < unit_count; ++unit) {
    const auto& parameters = units_[unit]->parameters();
    ready_[unit].assign(parameters.size(), 0);
    used_since_sync_[unit].assign(parameters.size(), 0);
    for (const auto& parameter : parameters) parameter_use_watch::watch(parameter.tensor, this, unit);
  }
  hook_gradient_accumulators();
  ready_count_.assign(unit_count, 0);
  completed_.assign(unit_count, 0);
  seen_.assign(unit_count, 0);
  gathered_in_backward_.assign(unit_count, 0);
  read_in_backward_.assign(unit_count, 1);  // until a backward has shown otherwise
  for (int unit = unit_count - 1; unit >= 0; --unit) reduction_order_.push_back(unit);
}

ShardedModel::~ShardedModel() {
  parameter_use_watch::forget(this);
  for (auto& hook : hooks_) compat::remove_grad_ready_hook(hook);
  try {
    for (auto& unit : units_) unit->reshard();
  } catch (const std::exception&) {
    // A gather that failed has been reported to the forward that started it.
  }
}

std::vector<torch::Tensor> ShardedModel::shards() const {
  std::vector<torch::Tensor> result;
  for (const auto& unit : units_) result.push_back(unit->shard());
  return result;
}

// Made while the parameters are resharded: the placeholder has the parameter's shape and the unit's param dtype,
// which the gradient accumulator records for its input.
void ShardedModel::hook_gradient_accumulators() {
  size_t hook = 0;
  for (int unit = 0; unit < static_cast<int>(units_.size()); ++unit) {
    const auto& parameters = units_[unit]->parameters();
    for (size_t index = 0; index < parameters.size(); ++index, ++hook) {
      if (hook < hooks_.size()) {
        if (hooks_[hook].accumulator == torch::autograd::impl::grad_accumulator(parameters[index].tensor)) continue;
        compat::remove_grad_ready_hook(hooks_[hook]);
      } else {
        hooks_.emplace_back();
      }
      hooks_[hook] = compat::add_grad_ready_hook(parameters[index].tensor,
                                                 [this, unit, index] { on_gradient_ready(unit, index); });
    }
  }
}

torch::Tensor ShardedModel::cast_forward_input(const torch::Tensor& input) const {
  const MixedPrecision& precision = options_.mixed_precision;
  if (!precision.cast_forward_inputs || !input.defined() || !input.is_floating_point()) return input;
  return input.to(precision.param_dtype);
}

void ShardedModel::before_forward() {
  rethrow_failure();
  parameter_use_watch::install_on_this_thread();
  Pause pause;
  // Left over from a forward without backward (evaluation): gathered before the optimizer last stepped.
  for (auto& unit : units_) unit->reshard();
  hook_gradient_accumulators();
  comm::Communicator* comm = communicator_.get();
  if (buffers_ && options_.broadcast_buffers && comm && comm->world_size() > 1) buffers_->broadcast(*comm);
  phase_ = Phase::kForward;
  current_ = -1;
  order_.clear();
  std::fill(seen_.begin(), seen_.end(), 0);
  reset_gradient_progress();
  reset_peak_unsharded_bytes();
  if (!units_.empty()) start_gather_of(previous_order_.empty() ? 0 : previous_order_.front());
}

void ShardedModel::after_forward() {
  // Without grad mode no backward follows: reads from here on are outside forward and backward.
  phase_ = torch::GradMode::is_enabled() ? Phase::kAfterForward : Phase::kIdle;
  if (!order_.empty()) previous_order_ = order_;
  // Backward completes the units roughly in the reverse of the forward's order, which is every rank's (the
  // gathers pair up in it); units the forward did not use come last.
  reduction_order_.assign(order_.rbegin(), order_.rend());
  for (int unit = static_cast<int>(units_.size()) - 1; unit >= 0; --unit) {
    if (!seen_[unit]) reduction_order_.push_back(unit);
  }
  Pause pause;
  if (options_.reshard_after_forward) {
    // The last unit stays: backward starts with it.
    for (int unit = 0; unit < static_cast<int>(units_.size()); ++unit) {
      if (unit != current_) units_[unit]->reshard();
    }
    if (current_ >= 0 && torch::GradMode::is_enabled()) prefetch_for_backward(neighbour_in_order(current_, -1));
  }
  rethrow_failure();
}

void ShardedModel::abandon_forward() noexcept {
  phase_ = Phase::kIdle;
  failure_ = nullptr;
  try {
    Pause pause;
    for (auto& unit : units_) unit->reshard();
  } catch (const std::exception&) {
    // The forward's own exception is the one the caller sees.
  }
}

void ShardedModel::before_use(const std::vector<int>& units) {
  if (failure_) return;
  try {
    if (phase_ == Phase::kForward) {
      const bool moves_on = std::find(units.begin(), units.end(), current_) == units.end();
      if (moves_on && current_ >= 0 && options_.reshard_after_forward) leave_unit(current_, units.back());
      for (int unit : units) {
        units_[unit]->unshard();
        if (!seen_[unit]) {
          seen_[unit] = 1;
          order_.push_back(unit);
        }
      }
      if (moves_on) {
        current_ = units.back();
        // Only a unit the forward has not used yet: one it comes back to (a block after its BatchNorm) is still
        // gathered or was needed no more.
        const int next = neighbour_in_order(current_, +1);
        if (next >= 0 && !seen_[next]) start_gather_of(next);
      }
    } else if (phase_ == Phase::kIdle && !parameter_use_watch::in_backward()) {
      // Outside forward and backward, on this rank alone as far as it knows: a gather would wait for ranks that
      // are not gathering. The operator reads the placeholder; the caller is told at the next call.
      const auto sharded = std::find_if(units.begin(), units.end(), [&](int unit) { return holds_placeholders(unit); });
      if (sharded == units.end()) return;
      failure_ = std::make_exception_ptr(InvalidArgument(fmt::format(
          "fsdp: an operator read a parameter of {} outside the forward and backward, where a sharded module holds "
          "placeholders (zeros); gather the weights with full_parameters() on every rank, or write a checkpoint",
          units_[*sharded]->name().empty() ? "the root unit" : "unit " + units_[*sharded]->name())));
      return;
    } else {
      // Backward (or between a forward and its backward): gather on demand, and the unit before this one, whose
      // gradient formulas come next.
      for (int unit : units) {
        units_[unit]->unshard();
        gathered_in_backward_[unit] = 1;
      }
      prefetch_for_backward(neighbour_in_order(units.back(), -1));
    }
    note_unsharded();
  } catch (...) {
    failure_ = std::current_exception();
  }
}

bool ShardedModel::holds_placeholders(int unit) const { return !units_[unit]->is_unsharded(); }

void ShardedModel::leave_unit(int from, int to) {
  if (nested_in_[to] == from) return;
  units_[from]->reshard();
  const int outer = nested_in_[from];
  if (outer >= 0 && outer != to && outer != nested_in_[to]) units_[outer]->reshard();
}

void ShardedModel::on_gradient_ready(int unit, size_t parameter) {
  if (!backward_started_) {
    backward_started_ = true;
    compat::queue_end_of_backward_callback([this] { finish_backward(); });
  }
  if (ready_[unit][parameter]) return;
  ready_[unit][parameter] = 1;
  if (++ready_count_[unit] < ready_[unit].size()) return;
  complete_unit(unit);
  if (gradient_sync_) {
    Pause pause;
    launch_ready_reductions(/*one_in_flight=*/true);
  }
}

void ShardedModel::complete_unit(int unit) {
  if (completed_[unit]) return;
  completed_[unit] = 1;
  Pause pause;
  if (!gradient_sync_) units_[unit]->accumulate_gradients();
  // The gradients stay in the parameters until the unit's reduction starts.
  units_[unit]->reshard();
}

void ShardedModel::launch_ready_reductions(bool one_in_flight) {
  while (next_reduction_ < reduction_order_.size() && completed_[reduction_order_[next_reduction_]]) {
    const int unit = reduction_order_[next_reduction_++];
    // One reduction in flight at a time, as FSDP2 keeps it: where the transport is slower than the backward,
    // starting every unit's reduce-scatter at once would hold every unit's full gradient until the end. A unit
    // completed in backward got every gradient here, so its piece goes into its shard.
    if (one_in_flight && reducing_ >= 0) units_[reducing_]->finish_gradient_reduction();
    units_[unit]->start_gradient_reduction();
    reducing_ = unit;
  }
}

std::vector<std::vector<char>> ShardedModel::agree_on_use() {
  std::vector<std::vector<char>> used = used_since_sync_;
  comm::Communicator* comm = communicator_.get();
  if (!comm || comm->world_size() == 1) return used;
  std::vector<float> flags;
  for (const auto& unit : used) flags.insert(flags.end(), unit.begin(), unit.end());
  torch::Tensor on_wire = torch::tensor(flags).to(comm->device());
  comm->all_reduce(on_wire, comm::ReduceOp::Sum)->wait();
  const torch::Tensor agreed = on_wire.cpu();
  const float* sums = agreed.data_ptr<float>();
  for (auto& unit : used) {
    for (char& flag : unit) flag = *sums++ > 0;
  }
  return used;
}

void ShardedModel::note_unused_elements(const std::vector<std::vector<char>>& used) {
  const int rank = communicator_ ? communicator_->rank() : 0;
  unused_elements_.assign(units_.size(), {});
  for (size_t unit = 0; unit < units_.size(); ++unit) {
    if (std::none_of(used[unit].begin(), used[unit].end(), [](char flag) { return flag != 0; })) continue;
    const int64_t shard_numel = units_[unit]->shard().numel();
    const int64_t shard_begin = rank * shard_numel;
    const auto& parameters = units_[unit]->parameters();
    for (size_t p = 0; p < parameters.size(); ++p) {
      if (used[unit][p]) continue;
      const int64_t begin = std::max(parameters[p].offset, shard_begin);
      const int64_t end = std::min(parameters[p].offset + parameters[p].numel, shard_begin + shard_numel);
      if (begin < end) unused_elements_[unit].emplace_back(begin - shard_begin, end - begin);
    }
  }
}

void ShardedModel::finish_backward() {
  Pause pause;
  for (size_t unit = 0; unit < units_.size(); ++unit) {
    for (size_t p = 0; p < ready_[unit].size(); ++p) used_since_sync_[unit][p] |= ready_[unit][p];
  }
  if (gradient_sync_ && reducing_ >= 0) units_[std::exchange(reducing_, -1)]->finish_gradient_reduction();
  // A unit some of whose parameters got no gradient here reduces too (zeros for those), in the same order as on
  // every other rank, so the collectives pair up whatever each rank's graph left out.
  for (int unit = 0; unit < static_cast<int>(units_.size()); ++unit) complete_unit(unit);
  if (gradient_sync_) {
    launch_ready_reductions(/*one_in_flight=*/false);
    // After every reduction has started, so that this all-reduce has the same place among the collectives on
    // every rank.
    const std::vector<std::vector<char>> used = agree_on_use();
    for (size_t unit = 0; unit < units_.size(); ++unit) {
      const bool any = std::any_of(used[unit].begin(), used[unit].end(), [](char flag) { return flag != 0; });
      units_[unit]->finish_gradient_reduction(/*into_shard=*/any);
    }
    note_unused_elements(used);
    for (auto& flags : used_since_sync_) std::fill(flags.begin(), flags.end(), 0);
  }
  phase_ = Phase::kIdle;
  // What this backward read decides the next one's prefetches.
  read_in_backward_ = gathered_in_backward_;
  // A second backward through the same graph (retain_graph) gathers, completes and reduces every unit again.
  reset_gradient_progress();
  rethrow_failure();
}

void ShardedModel::reset_gradient_progress() {
  for (auto& flags : ready_) std::fill(flags.begin(), flags.end(), 0);
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(completed_.begin(), completed_.end(), 0);
  std::fill(gathered_in_backward_.begin(), gathered_in_backward_.end(), 0);
  backward_started_ = false;
  reducing_ = -1;
  next_reduction_ = 0;
}

void ShardedModel::note_unsharded() {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += unit->held_parameter_bytes();
  peak_unsharded_ = std::max(peak_unsharded_, bytes);
}

void ShardedModel::prefetch_for_backward(int unit) {
  if (unit < 0 || completed_[unit] || !read_in_backward_[unit]) return;
  start_gather_of(unit);
}

void ShardedModel::start_gather_of(int unit) {
  if (unit < 0) return;
  units_[unit]->start_gather();
  note_unsharded();
}

int ShardedModel::neighbour_in_order(int unit, int offset) const {
  const int unit_count = static_cast<int>(units_.size());
  if (previous_order_.empty()) {
    const int neighbour = unit + offset;
    return neighbour >= 0 && neighbour < unit_count ? neighbour : -1;
  }
  const auto found = std::find(previous_order_.begin(), previous_order_.end(), unit);
  if (found == previous_order_.end()) return -1;
  const auto position = (found - previous_order_.begin()) + offset;
  return position >= 0 && position < static_cast<long>(previous_order_.size()) ? previous_order_[position] : -1;
}

void ShardedModel::rethrow_failure() {
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

std::vector<std::pair<std::string, torch::Tensor>> ShardedModel::gather_full_parameters() {
  std::vector<std::pair<std::string, torch::Tensor>> result;
  for (auto& unit : units_) {
    auto copies = unit->gather_copies();
    result.insert(result.end(), copies.begin(), copies.end());
  }
  return result;
}

HeldBytes ShardedModel::held_bytes() const {
  Pause pause;
  HeldBytes bytes;
  for (const auto& unit : units_) {
    bytes.shards += unit->shard().nbytes();
    if (unit->shard().grad().defined()) bytes.shard_gradients += unit->shard().grad().nbytes();
    bytes.unsharded += unit->held_parameter_bytes();
    bytes.full_gradients += unit->held_gradient_bytes();
  }
  return bytes;
}

}  // namespace tandem::fsdp
