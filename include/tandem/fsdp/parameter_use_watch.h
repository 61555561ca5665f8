#pragma once
// A forward pre-hook that works for any LibTorch module: LibTorch's C++ modules have no forward hooks, and a
// parent calls its children through its own typed members (CnnNet's conv1_, ResNet's stages), so no wrapper
// put into the tree would ever be called. What every module does call is ATen's operators, and each of them
// passes its input tensors through the dispatcher's RecordFunction observers before its kernel runs. The watch
// is such an observer: when an operator is about to read a watched tensor (a unit's parameter), it tells the
// tensor's owner first, who can still point the tensor at its gathered values. The same holds in backward,
// where the operators of a gradient formula read the parameters they saved.
//
// Limits: only ATen operators are seen (code that reads a tensor's memory by data_ptr() is not), and while the
// owner handles a use the watch is off on that thread, so the owner's own operators do not call it again.
#include <torch/types.h>

#include <vector>

namespace tandem::fsdp {

// Whoever owns watched tensors. before_use() runs on the thread that runs the operator, before its kernel, with
// every unit of this owner whose tensors the operator reads; it must not throw (RecordFunction swallows a
// callback's exception): an owner keeps its failure and reports it later.
class ParameterUser {
 public:
  virtual ~ParameterUser() = default;
  virtual void before_use(const std::vector<int>& units) = 0;
  // Whether `unit`'s tensors hold placeholders now rather than their values (these live elsewhere, in shards).
  virtual bool holds_placeholders(int unit) const = 0;
};

// Process-wide table of watched tensors, read by the observer on every thread where it is installed.
namespace parameter_use_watch {

// Calls user->before_use({unit, ...}) before any operator takes `tensor` (this TensorImpl) as an input.
void watch(const torch::Tensor& tensor, ParameterUser* user, int unit);
// Whether `tensor` is watched and its owner holds a placeholder in it now: code that reads a tensor's memory
// itself (a weights file) must refuse it, since the watch does not see such a read.
bool holds_placeholder(const torch::Tensor& tensor);
// Forgets every tensor of `user`.
void forget(ParameterUser* user);
// Installs the observer on the calling thread, once for the thread's life. A backward started from this thread
// carries it to the autograd engine's threads (LibTorch hands its thread-local state to them).
void install_on_this_thread();

// Whether the calling thread runs an autograd node's backward now (as seen by the observer, so only where it is
// installed): a retained graph's second backward comes when its owner thought the step over.
bool in_backward();

// Turns the watch off on this thread while it lives: for an owner's own work on its tensors.
class Pause {
 public:
  Pause();
  ~Pause();
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;

 private:
  bool previous_;
};

}  // namespace parameter_use_watch
}  // namespace tandem::fsdp
