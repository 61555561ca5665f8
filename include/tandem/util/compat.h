#pragma once
// The one place where tandem touches LibTorch internals that differ (or may differ) between LibTorch 1.13
// and 2.x. Everything else in tandem uses only these wrappers.
//
// Checked against the headers: 1.13's torch/csrc/autograd/{function.h,function_hook.h,engine.h,variable.h}
// and 2.x's. In both, Node::add_post_hook takes std::unique_ptr<FunctionPostHook>&& and returns a key for
// del_post_hook, impl::grad_accumulator() returns the leaf's AccumulateGrad node (held by the tensor only
// weakly) and Engine::queue_callback runs a callback when the current backward finishes. 2.x adds a
// non-pure FunctionPostHook::compiled_args (compiled autograd), which tandem's hooks do not support.
// c10d's TCPStore.hpp: 1.13's TCPStoreOptions has port, isServer, numWorkers, waitWorkers, timeout and
// multiTenant; 2.x adds masterListenFd and useLibUV.
// torch::data's interfaces (Sampler::reset and next, a data set's size) take and return `optional`:
// c10::optional in 1.13 (a class of its own), std::optional in 2.x.
// ATen/autocast_mode.h: 1.13 has one call pair per device (set_cpu_enabled, set_autocast_cpu_dtype; set_enabled
// and set_autocast_gpu_dtype for CUDA); 2.4 takes the device type as an argument and deprecates the old pairs.
// CPU autocast in 1.13 knows only bfloat16 (its Python torch.autocast refuses float16 on CPU); 2.x does both.
// variable.h's impl::gradient_edge and impl::set_gradient_edge, Tensor::set_data, c10's DeviceGuardImplInterface
// (getStream) and ATen/Config.h's AT_PARALLEL_OPENMP read the same in both.
#include <ATen/Config.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define TANDEM_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TANDEM_TORCH_VERSION_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace tandem::compat {

// The c10d class that Gloo's and NCCL's process groups derive from and that declares the collectives:
// ProcessGroup in 1.13, Backend from 2.0 on.
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// The optional type of torch::data's Sampler interface. c10::optional became an alias of std::optional in
// late 2023 (PyTorch 2.2) and is deprecated since. Before the alias c10::optional is the only right answer,
// after it both are; switching at 2.4 leaves a margin, and std::optional keeps compiling once the alias goes.
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 4)
template <typename T>
using TorchDataOptional = std::optional<T>;
#else
template <typename T>
using TorchDataOptional = c10::optional<T>;
#endif

// A post hook on a leaf's AccumulateGrad node: it runs after the incoming gradient has been added into
// param.grad(). Holding `accumulator` keeps the node (and so the hook) alive: a tensor holds it only weakly,
// and a node created anew on the next backward would not carry the hook.
struct GradReadyHook {
  std::shared_ptr<torch::autograd::Node> accumulator;
  std::uintptr_t key = 0;
};

namespace detail {
class CallbackPostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CallbackPostHook(std::function<void()> callback) : callback_(std::move(callback)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    callback_();
    return outputs;
  }

 private:
  std::function<void()> callback_;
};
}  // namespace detail

// Calls `on_ready` on the autograd thread each time backward has accumulated a gradient into `param`.
// `param` must be a leaf that requires grad.
inline GradReadyHook add_grad_ready_hook(const torch::Tensor& param, std::function<void()> on_ready) {
  GradReadyHook hook;
  hook.accumulator = torch::autograd::impl::grad_accumulator(param);
  hook.key = hook.accumulator->add_post_hook(std::make_unique<detail::CallbackPostHook>(std::move(on_ready)));
  return hook;
}

inline void remove_grad_ready_hook(GradReadyHook& hook) {
  if (hook.accumulator) hook.accumulator->del_post_hook(hook.key);
  hook.accumulator.reset();
}

// Runs `callback` once the backward pass that is executing on this thread has finished every node; must be
// called from inside that backward (a hook). An exception it throws comes out of loss.backward().
inline void queue_end_of_backward_callback(std::function<void()> callback) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

// Whether c10d's Gloo group gathers into one tensor (_allgather_base) and reduce-scatters. 1.13's refuses both
// ("no support for _allgather_base in Gloo process group", "ProcessGroupGloo does not support reduce_scatter");
// 2.11's does both (a 2-rank all_gather_into_tensor and reduce_scatter_tensor over gloo, run in PyTorch 2.11).
// The versions between are unchecked and take the communicator base's emulation, which is right everywhere.
inline constexpr bool kGlooHasTensorCollectives = TANDEM_TORCH_VERSION_AT_LEAST(2, 11);

// Releases a c10d group's communicators before the group itself is released. From 2.5 on, c10d's NCCL group
// warns "destroy_process_group() was not called" unless this happened, and then does the same itself. Abort,
// not shutdown: shutdown waits for outstanding NCCL work, which never ends when a peer has died, while tandem
// has waited for all of its own work before it lets a communicator go. 1.13 has neither call nor warning.
inline void release_communicators(C10dBackend& group) {
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 5)
  group.abort();
#else
  (void)group;
#endif
}

// Makes `options` serve a TCPStore from `listen_fd`, a socket the caller has bound and listens on; the store
// then owns it and closes it when it goes. Returns false, leaving `options` alone, where c10d cannot: 1.13's
// TCPStore always binds its port itself, on every interface, and 2.x's default libuv backend takes
// masterListenFd only from 2.8 on (pytorch/pytorch#150215).
inline bool serve_from_listening_socket(c10d::TCPStoreOptions& options, int listen_fd) {
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 8)
  options.masterListenFd = listen_fd;
  return true;
#else
  (void)options;
  (void)listen_fd;
  return false;
#endif
}

// The bytes of a c10d TCPStore request that changes nothing and that every TCPStore server answers with `value`
// itself: a compare-and-set of `key`, which must not exist, from `value` to `value` (a server answers the
// compare-and-set of a missing key with the expected value, and creates nothing). The answer reads as any value
// c10d sends: its length (uint64, host order), then its bytes. Strings go the same way. 1.13's COMPARE_SET is
// query 1. 2.x's is query 2 (VALIDATE took 0), and a connection's first request must be VALIDATE with c10d's
// magic number: the libuv server (2.x's default) ignores other first requests, the classic one resets the
// connection. Checked against 1.13's server and both of 2.11's (libuv and classic; num_keys unchanged after);
// the versions between are unchecked.
inline std::vector<uint8_t> store_echo_request(const std::string& key, const std::string& value) {
  std::vector<uint8_t> request;
  const auto append = [&request](const void* bytes, size_t size) {
    const auto* first = static_cast<const uint8_t*>(bytes);
    request.insert(request.end(), first, first + size);
  };
  const auto append_string = [&append](const std::string& text) {
    const uint64_t size = text.size();
    append(&size, sizeof(size));
    append(text.data(), text.size());
  };
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 0)
  constexpr uint8_t kValidate = 0;
  constexpr uint32_t kValidationMagicNumber = 0x3C85F7CE;
  constexpr uint8_t kCompareSet = 2;
  request.push_back(kValidate);
  append(&kValidationMagicNumber, sizeof(kValidationMagicNumber));
#else
  constexpr uint8_t kCompareSet = 1;
#endif
  request.push_back(kCompareSet);
  append_string(key);
  append_string(value);  // expected
  append_string(value);  // desired
  return request;
}

// Options for each kind of TCPStore server this LibTorch runs, by name, serving on a free port and waiting for no
// worker: 1.13 has one; 2.x has the libuv server (its default from 2.4 on) and the classic one (useLibUV false).
// Tests that speak the store's protocol run against each.
inline std::vector<std::pair<std::string, c10d::TCPStoreOptions>> tcp_store_server_kinds() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 4)
  c10d::TCPStoreOptions classic = options;
  options.useLibUV = true;
  classic.useLibUV = false;
  return {{"libuv", options}, {"classic", classic}};
#else
  return {{"classic", options}};
#endif
}

// c10d's Store: 2.x declares a pure clone(), a thread-safe store object over the same store, which 1.13 lacks
// (added in 2.5; the versions between 2.0 and 2.4 are unchecked). A store that tandem implements is thread-safe
// itself and derives from SharedStore, whose clone is the store itself.
class SharedStore : public c10d::Store {
 public:
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 5)
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this);
  }
#endif
};

// Drops every gradient of `optimizer`'s parameters, as zero_grad() does by default from LibTorch 2.0 on
// (set_to_none); 1.13's zero_grad() fills them with zeros instead. Dropping lets backward hand each new
// gradient over rather than add it to zeros, a pass over memory per parameter saved (measured: ResNet-18
// steps 226 -> 199 ms on one core).
inline void drop_gradients(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) param.mutable_grad() = torch::Tensor();
  }
}

// The key of `parameter`'s entry in an optimizer's per-parameter state(): its TensorImpl's address as text in
// 1.x (written as c10::guts::to_string writes a pointer), the address itself in 2.x. Deducing the key type keeps
// both builds on one code path (a template, so that only the branch of the build's key type is compiled). Two
// optimizers over the same parameter tensor use the same key.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const torch::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

// Autocast's per-thread setting for one device type. Only CPU and CUDA: tandem trains on nothing else.
struct AutocastSetting {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
};

inline bool autocast_knows(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA;
}

inline bool autocast_can_run(c10::DeviceType device_type, at::ScalarType dtype) {
  if (!autocast_knows(device_type) || (dtype != at::kBFloat16 && dtype != at::kHalf)) return false;
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 0)
  return true;
#else
  return device_type == c10::DeviceType::CUDA || dtype == at::kBFloat16;
#endif
}

inline AutocastSetting autocast_setting(c10::DeviceType device_type) {
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 4)
  return {at::autocast::is_autocast_enabled(device_type), at::autocast::get_autocast_dtype(device_type)};
#else
  if (device_type == c10::DeviceType::CPU) return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
  return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
#endif
}

inline void set_autocast_setting(c10::DeviceType device_type, AutocastSetting setting) {
#if TANDEM_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, setting.enabled);
  at::autocast::set_autocast_dtype(device_type, setting.dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(setting.enabled);
    at::autocast::set_autocast_cpu_dtype(setting.dtype);
  } else {
    at::autocast::set_enabled(setting.enabled);
    at::autocast::set_autocast_gpu_dtype(setting.dtype);
  }
#endif
}

// Multiplies every gradient in `grads` (one device and dtype) by `inv_scale` and sets `found_inf` (one float on
// that device) to 1 if any value is inf or NaN. ATen's fused kernel exists for CUDA in both versions and for
// the CPU from 2.3 on; 1.13's CPU gets the same arithmetic (one float multiply per value) op by op.
inline void unscale_and_check_finite(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                     const torch::Tensor& inv_scale) {
#if !TANDEM_TORCH_VERSION_AT_LEAST(2, 3)
  if (!found_inf.is_cuda()) {
    for (const auto& grad : grads) {
      found_inf.logical_or_(torch::isfinite(grad).all().logical_not());
      grad.mul_(inv_scale);
    }
    return;
  }
#endif
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

// Makes `stand_in` (a parameter of a model's copy) compute with `source`'s values and send the gradient it
// receives to wherever `source`'s would go: `source`'s grad_fn, or for a leaf its AccumulateGrad node, which sums
// what arrives from several stand-ins into source.grad(). `stand_in` shares `source`'s storage but keeps its own
// version counter (set_data), so in-place changes to `source` while a backward is pending go unnoticed. With
// `track_gradient` false `stand_in` becomes a constant. LibTorch's own torch::nn::parallel::replicate sets
// gradient edges on replicas the same way, through a node of its own.
inline void stand_in_for(const torch::Tensor& stand_in, const torch::Tensor& source, bool track_gradient) {
  stand_in.set_data(source);
  if (track_gradient && source.requires_grad()) {
    torch::autograd::impl::set_gradient_edge(stand_in, torch::autograd::impl::gradient_edge(source));
  } else {
    torch::autograd::impl::set_gradient_edge(stand_in, torch::autograd::Edge());  // a leaf again
    stand_in.requires_grad_(false);
  }
}

// The calling thread's current stream on `device` (the CPU has one, a placeholder), so that work handed to another
// thread can be queued on the same stream under a c10::StreamGuard.
inline c10::Stream current_stream(const torch::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// Whether at::set_num_threads on one thread leaves the intra-op thread counts of the threads already running alone.
// ATen's OpenMP backend (Debian's 1.13 and PyPI's 2.x) keeps a count per thread; it also keeps a process-wide one
// that threads starting later take, which the call overwrites. The native backend has one pool for all threads.
inline constexpr bool kIntraOpThreadsPerThread = AT_PARALLEL_OPENMP;

}  // namespace tandem::compat
