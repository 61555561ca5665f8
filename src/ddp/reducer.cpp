#include "tandem/ddp/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>

#include "tandem/comm/rank_layout.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::ddp {
namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;
// A cap no model reaches: one bucket per dtype.
constexpr double kOneBucketMb = 1024.0 * 1024.0;

// Whether this host's ranks' compute threads take every core this process may run on, leaving none for the
// backend's communication threads (BucketPlan::kAdaptToHost).
bool host_cores_taken_by_ranks() {
  const int local_ranks = comm::detect_rank_layout().local_world_size;
  return ranks_fill_cores(local_ranks, at::get_num_threads(), usable_cores());
}

bool is_same_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes();
}

std::vector<int64_t> contiguous_strides(const torch::Tensor& tensor) {
  std::vector<int64_t> strides(tensor.dim(), 1);
  for (int64_t d = tensor.dim() - 2; d >= 0; --d) strides[d] = strides[d + 1] * tensor.size(d + 1);
  return strides;
}

}  // namespace

Reducer::Reducer(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                 const torch::OrderedDict<std::string, torch::Tensor>& buffers, comm::CommunicatorPtr communicator,
                 DdpOptions options)
    : communicator_(std::move(communicator)), options_(std::move(options)) {
  if (options_.bucket_cap_mb <= 0 || options_.first_bucket_cap_mb <= 0) {
    throw InvalidArgument(fmt::format("bucket_cap_mb ({}) and first_bucket_cap_mb ({}) must be positive",
                                      options_.bucket_cap_mb, options_.first_bucket_cap_mb));
  }
  if (options_.check_replicas_every < 0) {
    throw InvalidArgument(fmt::format("check_replicas_every must be >= 0 (0: never), got {}", options_.check_replicas_every));
  }
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
  layouts_ = plan_buckets(trainable, nullptr);
  if (world_size_ == 1) return;  // nothing to agree on or reduce: no hooks, no buffers, no cost

  verify_replicas_match(*communicator_, parameters, buffers,
                        fmt::format("bucket_cap_mb={} first_bucket_cap_mb={} bucket_plan={} broadcast_buffers={} "
                                    "find_unused_parameters={} static_graph={} gradient_as_bucket_view={} "
                                    "comm_hook={} check_replicas_every={}",
                                    options_.bucket_cap_mb, options_.first_bucket_cap_mb,
                                    options_.bucket_plan == BucketPlan::kCaps ? "caps" : "adapt-to-host",
                                    options_.broadcast_buffers,
                                    options_.find_unused_parameters, options_.static_graph,
                                    options_.gradient_as_bucket_view, options_.comm_hook->name(),
                                    options_.check_replicas_every));
  if (options_.bucket_plan == BucketPlan::kAdaptToHost && communicator_->device().is_cpu()) {
    torch::Tensor one_bucket = torch::tensor({host_cores_taken_by_ranks() ? int64_t{1} : int64_t{0}});
    comm::broadcast_values(*communicator_, one_bucket, 0);
    if (one_bucket.item<int64_t>() != 0) {
      options_.first_bucket_cap_mb = options_.bucket_cap_mb = kOneBucketMb;
      layouts_ = plan_buckets(trainable, nullptr);
    }
  }
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
  ready_order_.reserve(params_.size());
  reset_iteration();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hook = compat::add_grad_ready_hook(params_[i].tensor, [this, i] { mark_ready(i); });
  }
}

// In the reverse registration order, or in `walk_order` where given.
std::vector<BucketLayout> Reducer::plan_buckets(const std::vector<torch::Tensor>& trainable,
                                                const std::vector<size_t>* walk_order) const {
  const auto first_cap = static_cast<int64_t>(options_.first_bucket_cap_mb * kBytesPerMb);
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * kBytesPerMb);
  return walk_order ? assign_buckets(trainable, *walk_order, first_cap, cap) : assign_buckets(trainable, first_cap, cap);
}

// The flat buffers of layouts_, each parameter's view of its slice, and the tail's places.
void Reducer::allocate_buckets() {
  tail_numel_ = 2 * int64_t{world_size_} + (unused_search_ ? static_cast<int64_t>(params_.size()) : 0);
  torch::NoGradGuard no_grad;
  tail_host_ = torch::zeros({tail_numel_}, torch::kFloat);
  if (!layouts_.empty() && layouts_.back().device.is_cuda()) tail_host_ = tail_host_.pin_memory();
  if (!layouts_.empty()) {
    tail_wire_ = torch::zeros({tail_numel_}, torch::TensorOptions().dtype(torch::kFloat).device(layouts_.back().device));
  }
  for (auto& param : params_) {
    param.bucket = kNoBucket;
    param.bucket_view = torch::Tensor();
  }
  buckets_.clear();
  buckets_.resize(layouts_.size());
  for (size_t b = 0; b < layouts_.size(); ++b) {
    const BucketLayout& layout = layouts_[b];
    const bool last = b + 1 == layouts_.size();
    buckets_[b].buffer = torch::zeros({layout.numel + (last ? tail_numel_ : 0)},
                                      torch::TensorOptions().dtype(layout.dtype).device(layout.device));
    for (size_t k = 0; k < layout.params.size(); ++k) {
      Param& param = params_[layout.params[k]];
      param.bucket = b;
      // Aliases the bucket's storage without being an autograd view, so that .grad can be this tensor and
      // still be detach_()-ed and zeroed by LibTorch 1.13's Optimizer::zero_grad().
      param.bucket_view = torch::empty({0}, buckets_[b].buffer.options())
                              .set_(buckets_[b].buffer.storage(), layout.offsets[k], param.tensor.sizes(),
                                    contiguous_strides(param.tensor));
      if (options_.gradient_as_bucket_view && param.tensor.grad().defined()) {
        param.bucket_view.copy_(param.tensor.grad());
        param.tensor.mutable_grad() = param.bucket_view;
      }
      buckets_[b].for_hook.gradients.push_back(param.bucket_view);
    }
    buckets_[b].for_hook.index = b;
    buckets_[b].for_hook.bucket_count = layouts_.size();
    buckets_[b].for_hook.buffer = buckets_[b].buffer.narrow(0, 0, layout.numel);
    buckets_[b].for_hook.model = this;
  }
  place_tail();
}

// Whether the tail rides in the last bucket (see tail_rides_): decided anew whenever the hook or buckets change.
void Reducer::place_tail() {
  if (buckets_.empty()) return;
  Bucket& last = buckets_.back();
  const torch::ScalarType dtype = last.buffer.scalar_type();
  tail_rides_ = options_.comm_hook->is_plain_average() && (dtype == torch::kFloat || dtype == torch::kDouble);
  last.for_hook.buffer = tail_rides_ ? last.buffer : last.buffer.narrow(0, 0, layouts_.back().numel);
}

// Buckets formed in reverse registration order launch late when backward produces gradients in another order
// (a layer registered early but used last, a shared head): their first gradient waits for their last. Rank 0's
// observed order is the one every rank adopts, so the collectives stay matched.
void Reducer::rebuild_buckets() {
  torch::Tensor order = torch::empty({static_cast<int64_t>(params_.size())}, torch::kLong);
  int64_t* out = order.data_ptr<int64_t>();
  std::vector<char> placed(params_.size(), 0);
  for (size_t index : ready_order_) {
    *out++ = static_cast<int64_t>(index);
    placed[index] = 1;
  }
  // Parameters without a gradient in that backward (or all of them on a rank that shadowed it) keep the
  // reverse registration order, after the others.
  for (size_t i = params_.size(); i-- > 0;) {
    if (!placed[i]) *out++ = static_cast<int64_t>(i);
  }
  comm::broadcast_values(*communicator_, order, 0);
  std::vector<size_t> walk;
  const int64_t* agreed = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < order.numel(); ++i) {
    const auto index = static_cast<size_t>(agreed[i]);
    if (options_.static_graph && !used_in_first_iteration_.empty() && !used_in_first_iteration_[index]) continue;
    walk.push_back(index);
  }
  std::vector<torch::Tensor> trainable;
  for (const auto& param : params_) trainable.push_back(param.tensor);
  layouts_ = plan_buckets(trainable, &walk);
  if (options_.static_graph) unused_search_ = false;
  allocate_buckets();
  reset_iteration();
  rebuild_due_ = false;
  buckets_rebuilt_ = true;
  ready_order_ = {};
  used_in_first_iteration_ = {};
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
  timeline_ = timeline;
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
  if (rebuild_due_) rebuild_buckets();
  if (buffer_broadcaster_) buffer_broadcaster_->broadcast(*communicator_, uneven_inputs_ ? last_trainer_ : 0);
  ++synchronised_forwards_;
  if (options_.check_replicas_every > 0 && synchronised_forwards_ % options_.check_replicas_every == 0) {
    verify_replicas_hold_same_values(*communicator_, checked_state_,
                                     fmt::format("at synchronised forward {}", synchronised_forwards_), participating);
  }
}

int Reducer::shadow_iteration() {
  if (world_size_ == 1) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) throw CommError(broken_);
  TANDEM_CHECK(!callback_queued_, "shadow_iteration during backward");
  synchronise_forward(/*participating=*/false);
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].buffer.narrow(0, 0, layouts_[b].numel).zero_();
    buckets_[b].pending = 0;
  }
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  local_unused_error_ = false;
  shadowing_ = true;
  TailAgreement agreement;
  try {
    agreement = reduce_buckets();
  } catch (...) {
    shadowing_ = false;
    throw;
  }
  shadowing_ = false;
  reset_iteration();
  if (!agreement.ranks_missing.empty()) throw_unused_parameters({}, agreement.ranks_missing);
  if (agreement.trained_ranks > 0) {
    average_over_trained(agreement.trained_ranks);
    write_back(agreement.globally_used);
  }
  after_agreement(agreement);
  return agreement.trained_ranks;
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
  // A backward that failed before its end left a partial order behind.
  if (recording_ready_order()) ready_order_.clear();
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
  if (recording_ready_order()) ready_order_.push_back(index);
  copy_grad_into_bucket(param);
  if (--buckets_[param.bucket].pending == 0) launch_complete_buckets();
}

void Reducer::copy_grad_into_bucket(Param& param) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& grad = param.tensor.grad();
  if (!grad.defined()) {
    param.bucket_view.zero_();
  } else if (grad.is_sparse()) {
    throw UnsupportedError("DistributedDataParallel does not support sparse gradients ('" + param.name + "')");
  } else if (!is_same_storage(grad, param.bucket_view)) {
    param.bucket_view.copy_(grad);
  }
}

// Buckets go out strictly in index order, the same on every rank, so the collectives match even if backward
// completes them in a different order.
void Reducer::launch_complete_buckets() {
  while (next_bucket_to_launch_ < buckets_.size() && buckets_[next_bucket_to_launch_].pending == 0) {
    const size_t index = next_bucket_to_launch_++;
    if (index + 1 == buckets_.size()) fill_tail();
    Bucket& bucket = buckets_[index];
    const bool recording = timeline_ && timeline_->recording();
    if (recording) bucket.launched_at = monitor::TimelineClock::now();
    bucket.work = options_.comm_hook->launch(*communicator_, bucket.for_hook);
    if (recording) {
      auto completed_at = std::make_shared<std::atomic<monitor::TimelineClock::rep>>(0);
      bucket.completed_at = completed_at;
      bucket.work->observe_completion(
          [completed_at] { completed_at->store(monitor::TimelineClock::now().time_since_epoch().count()); });
    }
    if (index + 1 == buckets_.size() && !tail_rides_) tail_work_ = communicator_->all_reduce(tail_wire_, comm::ReduceOp::Sum);
  }
}

torch::Tensor Reducer::tail_on_wire() {
  return tail_rides_ ? buckets_.back().buffer.narrow(0, layouts_.back().numel, tail_numel_) : tail_wire_;
}

// The previous iteration's copy of tail_host_ has completed: finish_backward read its result back.
void Reducer::fill_tail() {
  float* flags = tail_host_.data_ptr<float>();
  std::fill(flags, flags + tail_numel_, 0.0f);
  flags[rank_] = local_unused_error_ ? 1.0f : 0.0f;
  flags[world_size_ + rank_] = shadowing_ ? 0.0f : 1.0f;
  if (unused_search_) {
    for (size_t i = 0; i < params_.size(); ++i) flags[2 * world_size_ + i] = used_since_sync_[i] ? 1.0f : 0.0f;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor wire = tail_on_wire();
  wire.copy_(tail_host_, /*non_blocking=*/wire.is_cuda());
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
    throw_unused_parameters(missing, agreement.ranks_missing);
  }
  average_over_trained(agreement.trained_ranks);
  write_back(agreement.globally_used);
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  reset_iteration();
  ++synchronised_backwards_;
  after_agreement(agreement);
}

// Launches what is left, waits for every bucket and reads the tail. A failed collective breaks the reducer.
Reducer::TailAgreement Reducer::reduce_buckets() {
  launch_complete_buckets();
  TANDEM_CHECK(next_bucket_to_launch_ == buckets_.size(), "not every bucket was launched at the end of backward");

  const auto wait_begin = monitor::TimelineClock::now();
  std::exception_ptr failure;
  for (auto& bucket : buckets_) {
    try {
      bucket.work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (tail_work_) {
    try {
      tail_work_->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (timeline_ && timeline_->recording() && !failure && !shadowing_) record_allreduces(wait_begin);
  if (failure) {
    reset_iteration();
    broken_ = fmt::format(
        "DistributedDataParallel: a gradient all-reduce failed on rank {} (the error was raised by that backward), "
        "so the ranks' collectives can no longer be matched; stop every rank and restart from the last checkpoint",
        rank_);
    std::rethrow_exception(failure);
  }

  torch::NoGradGuard no_grad;
  torch::Tensor tail = tail_on_wire().to(torch::kCPU, torch::kFloat);
  const float* flags = tail.data_ptr<float>();
  TailAgreement agreement;
  for (int r = 0; r < world_size_; ++r) {
    if (flags[r] != 0.0f) agreement.ranks_missing.push_back(r);
    if (flags[world_size_ + r] != 0.0f) {
      ++agreement.trained_ranks;
      agreement.highest_trained_rank = r;
    }
  }
  if (unused_search_) {
    agreement.globally_used.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) agreement.globally_used[i] = flags[2 * world_size_ + i] != 0.0f;
  }
  return agreement;
}

// Every rank throws once the tail named ranks with parameters that got no gradient: those ranks name their
// parameters (`missing`), the others name those ranks.
void Reducer::throw_unused_parameters(const std::vector<std::string>& missing,
                                      const std::vector<int>& ranks_missing) const {
  const std::string advice =
      "if the model does not use every parameter in each iteration, construct DistributedDataParallel with "
      "DdpOptions::find_unused_parameters = true";
  if (!missing.empty()) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: parameters got no gradient in this backward on rank {} ({}); ranks with such "
        "parameters: [{}]; {}",
        rank_, fmt::join(missing, ", "), fmt::join(ranks_missing, ", "), advice));
  }
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: ranks [{}] had parameters that got no gradient in this backward (their error names "
      "them); {}",
      fmt::join(ranks_missing, ", "), advice));
}

// Ranks that shadowed this iteration sent zeros: the comm hook's mean over the world becomes the mean over the
// ranks that trained. The same arithmetic on the same reduced buckets on every rank, shadowing or not.
void Reducer::average_over_trained(int trained_ranks) {
  if (trained_ranks == world_size_) return;
  torch::NoGradGuard no_grad;
  const double rescale = static_cast<double>(world_size_) / trained_ranks;
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].buffer.narrow(0, 0, layouts_[b].numel).mul_(rescale);
}

// The first iteration that some rank trained in decides the rebuild, on every rank alike.
void Reducer::after_agreement(const TailAgreement& agreement) {
  if (agreement.trained_ranks > 0) last_trainer_ = agreement.highest_trained_rank;
  if (buckets_rebuilt_ || rebuild_due_ || agreement.trained_ranks == 0) return;
  // With the unused-parameter search on, the order changes from iteration to iteration; PyTorch rebuilds then
  // only for a static graph, and so do we.
  if (options_.find_unused_parameters && !options_.static_graph) return;
  rebuild_due_ = true;
  used_in_first_iteration_ = agreement.globally_used;
}

// Every bucket has completed; a backend thread may not yet have reported the completion it is about to report,
// and then the wait's end stands in for it.
void Reducer::record_allreduces(monitor::TimelineClock::time_point wait_begin) {
  const auto wait_end = monitor::TimelineClock::now();
  const int64_t step = timeline_->current_step();
  timeline_->add_span(monitor::SpanKind::kAllReduceWait, step, wait_begin, wait_end);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.completed_at) continue;  // launched before the step was recorded
    const auto reported = bucket.completed_at->load();
    const auto completed =
        reported != 0 ? monitor::TimelineClock::time_point(monitor::TimelineClock::duration(reported)) : wait_end;
    timeline_->add_span(monitor::SpanKind::kAllReduce, step, bucket.launched_at, std::min(completed, wait_end),
                        static_cast<int64_t>(b));
    bucket.completed_at.reset();
  }
}

void Reducer::write_back(const std::vector<char>& globally_used) {
  for (size_t i = 0; i < params_.size(); ++i) {
    // A parameter no rank used keeps its .grad as it was, as in a single process.
    if (!globally_used.empty() && !globally_used[i]) continue;
    Param& param = params_[i];
    if (param.bucket == kNoBucket) continue;  // static_graph found it unused
    torch::Tensor& grad = param.tensor.mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_same_storage(grad, param.bucket_view)) grad = param.bucket_view;
    } else if (grad.defined()) {
      grad.copy_(param.bucket_view);
    } else {
      grad = param.bucket_view.clone();
    }
  }
}

void Reducer::reset_iteration() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = layouts_[b].params.size();
    buckets_[b].work.reset();
    buckets_[b].completed_at.reset();
  }
  tail_work_.reset();
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
  drain(tail_work_);
}

}  // namespace tandem::ddp
