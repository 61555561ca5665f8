#include "tandem/fsdp/parameter_use_watch.h"

#include <ATen/record_function.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::fsdp::parameter_use_watch {
namespace {

struct Owner {
  ParameterUser* user;
  int unit;
};

std::mutex table_mutex;
std::unordered_map<const c10::TensorImpl*, Owner> table;
// Lets the observer skip the lock while nothing is watched.
std::atomic<size_t> watched{0};
thread_local bool paused = false;
thread_local int backward_depth = 0;

void collect(const torch::Tensor& tensor, std::vector<Owner>& hits) {
  if (!tensor.defined()) return;
  auto found = table.find(tensor.unsafeGetTensorImpl());
  if (found == table.end()) return;
  for (const Owner& hit : hits) {
    if (hit.user == found->second.user && hit.unit == found->second.unit) return;
  }
  hits.push_back(found->second);
}

std::unique_ptr<at::ObserverContext> on_operator_start(const at::RecordFunction& fn) {
  if (paused || watched.load(std::memory_order_relaxed) == 0) return nullptr;
  std::vector<Owner> hits;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    for (const c10::IValue& input : fn.inputs()) {
      if (input.isTensor()) {
        collect(input.toTensor(), hits);
      } else if (input.isTensorList()) {
        for (const torch::Tensor& tensor : input.toTensorVector()) collect(tensor, hits);
      }
    }
  }
  if (hits.empty()) return nullptr;
  Pause pause;
  // One call per owner, with all of its units that this operator reads.
  for (size_t first = 0; first < hits.size(); ++first) {
    if (!hits[first].user) continue;
    std::vector<int> units;
    for (size_t other = first; other < hits.size(); ++other) {
      if (hits[other].user != hits[first].user) continue;
      units.push_back(hits[other].unit);
      if (other != first) hits[other].user = nullptr;
    }
    hits[first].user->before_use(units);
  }
  return nullptr;
}

std::unique_ptr<at::ObserverContext> on_backward_node_start(const at::RecordFunction&) {
  ++backward_depth;
  return nullptr;
}

void on_backward_node_end(const at::RecordFunction&, at::ObserverContext*) { --backward_depth; }

}  // namespace

void watch(const torch::Tensor& tensor, ParameterUser* user, int unit) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table[tensor.unsafeGetTensorImpl()] = Owner{user, unit};
  watched.store(table.size());
}

bool holds_placeholder(const torch::Tensor& tensor) {
  if (!tensor.defined()) return false;
  std::lock_guard<std::mutex> lock(table_mutex);
  auto found = table.find(tensor.unsafeGetTensorImpl());
  return found != table.end() && found->second.user->holds_placeholders(found->second.unit);
}

void forget(ParameterUser* user) {
  std::lock_guard<std::mutex> lock(table_mutex);
  for (auto entry = table.begin(); entry != table.end();) {
    entry = entry->second.user == user ? table.erase(entry) : std::next(entry);
  }
  watched.store(table.size());
}

void install_on_this_thread() {
  thread_local bool installed = false;
  if (installed) return;
  at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_operator_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  at::addThreadLocalCallback(at::RecordFunctionCallback(on_backward_node_start, on_backward_node_end)
                                 .scopes({at::RecordScope::BACKWARD_FUNCTION}));
  installed = true;
}

bool in_backward() { return backward_depth > 0; }

Pause::Pause() : previous_(paused) { paused = true; }
Pause::~Pause() { paused = previous_; }

}  // namespace tandem::fsdp::parameter_use_watch
