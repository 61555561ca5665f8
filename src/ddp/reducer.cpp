#include "tandem/ddp/reducer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>

#include "bucket_plan.h"
#include "ddp_options_check.h"
#include "tandem/util/error.h"
#include "tandem/util/heap_retention.h"
#include "unused_parameter_error.h"

namespace tandem::ddp {
Reducer::Reducer(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                 const torch::OrderedDict<std::string, torch::Tensor>& buffers, comm::CommunicatorPtr communicator,
                 DdpOptions options)
    : communicator_(std::move(communicator)), options_(std::move(options)) {
  check_ddp_options(options_);
  if (!options_.comm_hook) options_.comm_hook = make_average_hook();
  if (communicator_) {
    rank_ = communicator_->rank();
    world_size_ = communicator_->world_size();
  }
  last_trainer_ = world_size_ - 1;

  std::vector<torch::Tensor> trainable;
  for (const auto& item : parameters) {
    if (!item.value().requires_grad()) continue;  // frozen: no bucket, no hook, no communication
    if (item.value().is_sparse()) throw UnsupportedError("DistributedDataParallel does not support sparse parameters ('" + item.key() + "')");
    Param param;
    param.name = item.key();
    param.tensor = item.value();
    params_.push_back(std::move(param));
    trainable.push_back(item.value());
  }
  layouts_ = plan_buckets(options_, trainable, nullptr);
  if (world_size_ == 1) return;  // nothing to agree on or reduce: no hooks, no buffers, no cost
  // Each step's gradients, bucket copies and all-reduce then reuse mapped pages (util/heap_retention.h).
  if (communicator_->device().is_cpu()) retain_freed_heap_memory();

  verify_replicas_match(*communicator_, parameters, buffers, describe_ddp_options(options_));
  if (adapt_caps_to_host(options_, *communicator_)) layouts_ = plan_buckets(options_, trainable, nullptr);
  model_state_ = parameters.values();
  for (const auto& buffer : buffers.values()) model_state_.push_back(buffer);
  copy_replica_from(0);
  if (options_.broadcast_buffers && !buffers.is_empty()) {
    buffer_broadcaster_ = std::make_unique<CoalescedBroadcaster>(buffers.values());
    if (buffer_broadcaster_->empty()) buffer_broadcaster_.reset();
  }
  if (options_.check_replicas_every > 0) {
    checked_state_ = parameters;
    if (options_.broadcast_buffers) checked_state_.update(buffers);
  }

  unused_search_ = options_.find_unused_parameters;
  allocate_buckets();
  ready_.assign(params_.size(), 0);
  used_since_sync_.assign(params_.size(), 0);
  rebuild_.reserve(params_.size());
  reset_iteration();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hook = compat::add_grad_ready_hook(params_[i].tensor, [this, i] { mark_ready(i); });
  }
}

void Reducer::copy_replica_from(int root) {
  if (world_size_ == 1) return;
  CoalescedBroadcaster(model_state_).broadcast(*communicator_, root);
}

Reducer::~Reducer() {
  for (auto& param : params_) compat::remove_grad_ready_hook(param.hook);
  drain_in_flight();
}

std::vector<std::string> Reducer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& param : params_) names.push_back(param.name);
  return names;
}

void Reducer::set_timeline(monitor::Timeline* timeline) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!callback_queued_, "set_timeline during backward");
  spans_.set_timeline(timeline);
}

void Reducer::register_comm_hook(CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!callback_queued_, "register_comm_hook during backward");
  options_.comm_hook = hook ? std::move(hook) : make_average_hook();
  place_tail();
}

void Reducer::prepare_for_forward() {
  if (world_size_ == 1) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Our end-of-backward callback never ran: an exception stopped that backward after some buckets were
    // launched here, while the peers launched all of theirs. Our next collective would be matched against
    // their stale ones, so the reducer must not be used again.
    if (callback_queued_) {
      broken_ = fmt::format(
          "DistributedDataParallel: an earlier backward on rank {} stopped with an exception before it finished, so "
          "this rank's gradient all-reduces are out of step with the other ranks'; stop every rank and restart from "
          "the last checkpoint",
          rank_);
      callback_queued_ = false;
    }
    if (!broken_.empty()) throw CommError(broken_);
    // No graph is recorded, so no backward can follow this forward: it must leave the iteration's state (and
    // the buffers) alone, or an evaluation forward between a forward and its backward would turn sync off.
    if (!torch::GradMode::is_enabled()) return;
    sync_this_iteration_ = require_sync_;
    backward_expected_ = true;
  }
  if (!sync_this_iteration_) return;
  synchronise_forward(/*participating=*/true);
}

// The collectives of a synchronised forward, the same whether this rank trains or shadows.
void Reducer::synchronise_forward(bool participating) {
  if (rebuild_.due()) rebuild_buckets();
  if (buffer_broadcaster_) buffer_broadcaster_->broadcast(*communicator_, uneven_inputs_ ? last_trainer_ : 0);
  ++synchronised_forwards_;
  if (options_.check_replicas_every > 0 && synchronised_forwards_ % options_.check_replicas_every == 0) {
    verify_replicas_hold_same_values(*communicator_, checked_state_,
                                     fmt::format("at synchronised forward {}", synchronised_forwards_), participating);
  }
}

void Reducer::watch_output(const torch::Tensor& output) {
  if (world_size_ == 1 || !torch::GradMode::is_enabled() || !output.requires_grad()) return;
  std::weak_ptr<Reducer*> self = self_;
  output.register_hook([self](const torch::Tensor&) {
    if (auto reducer = self.lock()) (*reducer)->expect_end_of_backward();
  });
}

// A backward that reached the wrapper's output runs before any of the parameters' hooks: it is one through a
// forward of the wrapper even when it is the second over a retained graph, after the first one disarmed them.
void Reducer::expect_end_of_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  backward_expected_ = true;
  if (sync_this_iteration_) queue_finish_backward();
}

void Reducer::queue_finish_backward() {
  if (callback_queued_) return;
  callback_queued_ = true;
  rebuild_.discard_partial_order();
  compat::queue_end_of_backward_callback([this] { finish_backward(); });
}

void Reducer::mark_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!backward_expected_) return;  // a backward through the bare module: local, as without DDP
  used_since_sync_[index] = 1;
  if (!sync_this_iteration_) return;  // no_sync: .grad just accumulates
  Param& param = params_[index];
  queue_finish_backward();
  if (ready_[index]) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: parameter '{}' received a gradient twice in one backward; run each forward's "
        "backward once per synchronised iteration",
        param.name));
  }
  if (param.bucket == kNoBucket) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: parameter '{}' got a gradient, but no rank used it in the first iteration and "
        "static_graph promised the same parameters every iteration; turn static_graph off for this model",
        param.name));
  }
  ready_[index] = 1;
  rebuild_.record_ready(index);
  copy_grad_into_bucket(param);
  if (--buckets_[param.bucket].pending == 0) launch_complete_buckets();
}

// Buckets go out strictly in index order, the same on every rank, so the collectives match even if backward
// completes them in a different order.
void Reducer::launch_complete_buckets() {
  while (next_bucket_to_launch_ < buckets_.size() && buckets_[next_bucket_to_launch_].pending == 0) {
    const size_t index = next_bucket_to_launch_++;
    const bool last = index + 1 == buckets_.size();
    if (last) tail_.fill(rank_, local_unused_error_, /*trained=*/!shadowing_, used_since_sync_);
    Bucket& bucket = buckets_[index];
    const bool recording = spans_.recording();
    if (recording) spans_.launching(index);
    bucket.work = options_.comm_hook->launch(*communicator_, bucket.for_hook);
    if (recording) spans_.launched(index, *bucket.work);
    if (last) tail_.launch(*communicator_);
  }
}

void Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  backward_expected_ = false;
  // Parameters whose hook did not fire in this backward. Either they are treated as ready (with whatever
  // .grad they accumulated under no_sync, or zero), or, without the unused-parameter search, they are
  // zero-filled so that every collective still completes on every rank, and the error rides on the last
  // bucket's tail.
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& param = params_[i];
    if (ready_[i] || param.bucket == kNoBucket) continue;
    if (unused_search_) {
      copy_grad_into_bucket(param);
    } else {
      torch::NoGradGuard no_grad;
      param.bucket_view.zero_();
      missing.push_back(param.name);
    }
    ready_[i] = 1;
    --buckets_[param.bucket].pending;
  }
  local_unused_error_ = !missing.empty();
  const TailAgreement agreement = reduce_buckets();
  if (!agreement.ranks_missing.empty()) {
    reset_iteration();
    std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
    throw_unused_parameters(rank_, missing, agreement.ranks_missing);
  }
  average_over_trained(agreement.trained_ranks);
  write_back(agreement.globally_used);
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  reset_iteration();
  ++synchronised_backwards_;
  after_agreement(agreement);
}

// Launches what is left, waits for every bucket and reads the tail. A failed collective breaks the reducer.
TailAgreement Reducer::reduce_buckets() {
  launch_complete_buckets();
  TANDEM_CHECK(next_bucket_to_launch_ == buckets_.size(), "not every bucket was launched at the end of backward");

  const auto wait_begin = monitor::TimelineClock::now();
  std::exception_ptr failure;
  const auto wait = [&failure](const comm::WorkPtr& work) {
    try {
      work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  for (auto& bucket : buckets_) wait(bucket.work);
  if (tail_.work()) wait(tail_.work());
  if (spans_.recording() && !failure && !shadowing_) spans_.record(wait_begin);
  if (failure) {
    reset_iteration();
    broken_ = fmt::format(
        "DistributedDataParallel: a gradient all-reduce failed on rank {} (the error was raised by that backward), "
        "so the ranks' collectives can no longer be matched; stop every rank and restart from the last checkpoint",
        rank_);
    std::rethrow_exception(failure);
  }

  return tail_.read();
}

// The first iteration that some rank trained in decides the rebuild, on every rank alike.
void Reducer::after_agreement(const TailAgreement& agreement) {
  if (agreement.trained_ranks > 0) last_trainer_ = agreement.highest_trained_rank;
  rebuild_.decide(agreement.trained_ranks, agreement.globally_used, options_.find_unused_parameters,
                  options_.static_graph);
}

void Reducer::reset_iteration() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = layouts_[b].params.size();
    buckets_[b].work.reset();
  }
  spans_.reset();
  tail_.reset();
  next_bucket_to_launch_ = 0;
  callback_queued_ = false;
  local_unused_error_ = false;
}

void Reducer::drain_in_flight() noexcept {
  const auto drain = [](const comm::WorkPtr& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {
      // Already failed; the reducer is being reset or destroyed and nobody can use the result.
    }
  };
  for (auto& bucket : buckets_) drain(bucket.work);
  drain(tail_.work());
}

}  // namespace tandem::ddp
