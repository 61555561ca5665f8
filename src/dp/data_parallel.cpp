#include "tandem/dp/data_parallel.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/StreamGuard.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "tandem/amp/autocast.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::dp {

// One thread that runs its replica's forward, kept for the life of the DataParallel. Starting a thread per
// forward instead cost about 0.1 ms a forward for two replicas on the 2-core VM, and tens of milliseconds once
// each replica had two intra-op threads: every new thread starts an OpenMP team of its own.
class ReplicaThread {
 public:
  ReplicaThread() : thread_([this] { serve(); }) {}

  // Lets the task in hand finish (forward() has waited for it anyway), then joins.
  ~ReplicaThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  // Runs `task` on this thread; the future carries its exception. One task at a time.
  std::future<void> run(std::function<void()> task) {
    std::packaged_task<void()> packaged(std::move(task));
    std::future<void> done = packaged.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TANDEM_CHECK(!task_.valid(), "a DataParallel replica thread was handed a task while busy");
      task_ = std::move(packaged);
    }
    wake_.notify_one();
    return done;
  }

 private:
  void serve() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || task_.valid(); });
        if (!task_.valid()) return;
        task = std::move(task_);
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::packaged_task<void()> task_;  // valid from run() until the thread takes it
  bool stopping_ = false;
  std::thread thread_;  // last, so that it starts after the members it uses
};

// Replica k >= 1: a deep copy of the model, and the pairs (the original's tensor or module, the copy's) that
// forward() re-binds, matched by name once here.
struct ReplicaCopy {
  nn::ModelHolder model;
  torch::Device device;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> parameters;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, std::shared_ptr<torch::nn::Module>>> modules;
};

namespace {

template <typename Value>
std::vector<std::pair<Value, Value>> pair_by_name(const torch::OrderedDict<std::string, Value>& original,
                                                  const torch::OrderedDict<std::string, Value>& copy) {
  TANDEM_CHECK(original.size() == copy.size(), "a clone of the model has ", copy.size(), " entries where it has ",
               original.size());
  std::vector<std::pair<Value, Value>> pairs;
  for (const auto& item : original) pairs.emplace_back(item.value(), copy[item.key()]);
  return pairs;
}

ReplicaCopy make_copy(const nn::ModelHolder& model, const torch::Device& device) {
  std::optional<nn::ModelHolder> copy;
  try {
    copy = model.clone(device);
  } catch (const c10::Error& error) {
    // LibTorch's message names the module and what to do (derive it from torch::nn::Cloneable); its first line.
    throw InvalidArgument(detail::concat("DataParallel copies the model onto each device after the first, but ",
                                         first_line(error.what_without_backtrace())));
  }
  torch::nn::Module& original = *model;
  torch::nn::Module& cloned = **copy;
  return ReplicaCopy{*copy, device, pair_by_name(original.named_parameters(), cloned.named_parameters()),
                     pair_by_name(original.named_buffers(), cloned.named_buffers()),
                     pair_by_name(original.named_modules(), cloned.named_modules())};
}

// A tensor's CPU device has no index; a GPU must be named by one, or the model's device could not be checked.
torch::Device checked_device(const torch::Device& device) {
  if (device.is_cpu()) return torch::Device(torch::kCPU);
  if (!device.has_index()) {
    throw InvalidArgument(detail::concat("DataParallel needs each GPU by its index (", device, ":0, not ", device,
                                         ")"));
  }
  return device;
}

std::vector<torch::Device> checked_devices(const std::vector<torch::Device>& devices) {
  if (devices.empty()) throw InvalidArgument("DataParallel needs at least one device");
  std::vector<torch::Device> checked;
  for (const auto& device : devices) checked.push_back(checked_device(device));
  return checked;
}

std::string message_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

std::vector<torch::Device> replica_devices(const torch::Device& device, int count) {
  if (count < 0) throw InvalidArgument(fmt::format("DataParallel: {} replicas", count));
  if (!device.is_cuda()) return std::vector<torch::Device>(count > 0 ? count : std::max(1, at::get_num_threads()), device);
  const int visible = static_cast<int>(torch::cuda::device_count());
  if (count > visible) {
    throw InvalidArgument(fmt::format("DataParallel: {} GPU replicas asked for, but {} GPUs are visible", count, visible));
  }
  std::vector<torch::Device> devices;
  for (int i = 0; i < (count > 0 ? count : visible); ++i) devices.emplace_back(torch::kCUDA, i);
  return devices;
}

DataParallel::DataParallel(nn::ModelHolder model, DataParallelOptions options)
    : model_(std::move(model)),
      devices_(checked_devices(options.devices)),
      output_device_(checked_device(options.output_device.value_or(devices_.front()))) {
  for (size_t k = 1; k < devices_.size(); ++k) copies_.push_back(make_copy(model_, devices_[k]));
  for (size_t k = 0; k < devices_.size(); ++k) threads_.push_back(std::make_unique<ReplicaThread>());

  // The CPU replicas run at the same time, so each gets its share of the caller's intra-op threads; with the
  // caller's count each, N replica threads would start N times as many OpenMP threads as there are cores. The
  // backward runs on the caller's thread with all of them. Each thread reads its count first, as ATen would
  // at its first parallel operation, so that the process-wide count put back below does not replace it later.
  const int caller_threads = at::get_num_threads();
  const auto cpu_replicas = std::count_if(devices_.begin(), devices_.end(), [](auto& d) { return d.is_cpu(); });
  if (compat::kIntraOpThreadsPerThread && cpu_replicas > 0) {
    const int share = std::max(1, caller_threads / static_cast<int>(cpu_replicas));
    std::vector<std::future<void>> done;
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (!devices_[k].is_cpu()) continue;
      done.push_back(threads_[k]->run([share] {
        at::get_num_threads();
        at::set_num_threads(share);
      }));
    }
    for (auto& one : done) one.get();
    at::set_num_threads(caller_threads);
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::rebind(ReplicaCopy& copy, bool track_gradient) {
  // A copy to another device made in inference mode would be an inference tensor, which cannot stand in for a
  // normal one; grad mode stays the caller's.
  c10::InferenceMode normal_tensors(false);
  torch::AutoGradMode grad_mode(track_gradient);
  for (auto& [original, stand_in] : copy.parameters) {
    compat::stand_in_for(stand_in, original.to(copy.device), track_gradient);
  }
  torch::NoGradGuard no_grad;
  for (auto& [original, buffer] : copy.buffers) buffer.copy_(original);
  for (auto& [original, module] : copy.modules) module->train(original->is_training());
}

torch::Tensor DataParallel::forward(const torch::Tensor& input) {
  if (input.dim() == 0) throw InvalidArgument("DataParallel splits its input along dim 0, but got a 0-dim tensor");
  const int64_t batch = input.size(0);
  if (batch == 0) throw InvalidArgument("DataParallel got an empty batch (dim 0 has size 0)");
  for (const auto& tensors : {module().parameters(), module().buffers()}) {
    for (const auto& tensor : tensors) {
      if (tensor.device() != devices_.front()) {
        throw InvalidArgument(detail::concat("DataParallel needs the model on devices[0] (", devices_.front(),
                                             ") but it holds a tensor on ", tensor.device()));
      }
    }
  }

  const size_t used = static_cast<size_t>(std::min<int64_t>(batch, static_cast<int64_t>(devices_.size())));
  const bool track_gradient = torch::GradMode::is_enabled();
  for (size_t k = 1; k < used; ++k) rebind(copies_[k - 1], track_gradient);

  // Differentiable scatter: views of the input, moved to each device, so its gradient flows back through both.
  std::vector<torch::Tensor> chunks;
  const int64_t base = batch / static_cast<int64_t>(used), larger = batch % static_cast<int64_t>(used);
  for (int64_t k = 0, start = 0; k < static_cast<int64_t>(used); ++k) {
    const int64_t size = base + (k < larger ? 1 : 0);
    chunks.push_back(input.narrow(0, start, size).to(devices_[k]));
    start += size;
  }

  std::vector<torch::Tensor> outputs(used);
  const at::ThreadLocalState caller_state;
  // 1.13's ThreadLocalState carries whether autocast is on but not its dtype.
  const amp::AutocastSettings caller_autocast = amp::current_autocast();
  std::vector<std::future<void>> done;
  for (size_t k = 0; k < used; ++k) {
    nn::ModelHolder* replica = k == 0 ? &model_ : &copies_[k - 1].model;
    // The replica queues its kernels on the stream the caller's thread uses on that device, after the copy of
    // its chunk queued there above.
    const c10::Stream stream = compat::current_stream(devices_[k]);
    done.push_back(threads_[k]->run([&caller_state, &caller_autocast, &chunks, &outputs, replica, stream, k] {
      at::ThreadLocalStateGuard state(caller_state);
      amp::AutocastSettingsScope autocast(caller_autocast);
      c10::StreamGuard on_stream(stream);
      outputs[k] = (*replica)->forward(chunks[k]);
    }));
  }
  // Every replica finishes before anything is thrown: their tasks use this frame's chunks and outputs.
  std::exception_ptr failure;
  size_t failed = 0;
  for (size_t k = 0; k < used; ++k) {
    try {
      done[k].get();
    } catch (...) {
      if (!failure) std::tie(failure, failed) = std::make_pair(std::current_exception(), k);
    }
  }
  if (failure) {
    throw Error(detail::concat("DataParallel replica ", failed, " on ", devices_[failed], ": ", message_of(failure)));
  }

  // Differentiable gather on the output device.
  for (size_t k = 0; k < used; ++k) {
    if (outputs[k].dim() == 0) {
      throw InvalidArgument(detail::concat("DataParallel joins the outputs along dim 0, but replica ", k,
                                           " returned a 0-dim tensor"));
    }
    outputs[k] = outputs[k].to(output_device_);
  }
  return torch::cat(outputs, 0);
}

}  // namespace tandem::dp
