#pragma once
// A blocking call with a deadline it does not have of its own. c10d's TCPStore client waits for its server's
// answer without one (LibTorch 2.x's constructor pings and waits; 1.13 waits on any request), so a peer that
// accepts connections and never answers would hold the caller for ever, whatever its timeout says. The call runs
// on a thread of its own; the caller waits for it until the deadline and then goes on without it.
//
// The abandoned thread. Nothing can stop a thread blocked in a socket read, so past the deadline it is left
// behind (detached): it runs on until its call returns, or until the process ends (exit does not wait for it).
// So it must touch nothing the caller may free: `call` is moved into the thread and must own what it uses
// (capture by value: intrusive_ptr, shared_ptr; never a reference to the caller's locals, nor `this` of an
// object that may go first), and the slot its answer goes to is held by both sides (a shared_ptr to the
// promise), so that an answer arriving after the caller left is written into memory that still exists and is
// freed with the thread's last reference.
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>

namespace tandem {

// What call_within hands back for `Call`: its result, or std::monostate where it returns nothing.
template <typename Call>
using CallResult = std::conditional_t<std::is_void_v<std::invoke_result_t<Call&>>, std::monostate,
                                      std::invoke_result_t<Call&>>;

// How often call_within asks `interrupted` while it waits.
inline constexpr std::chrono::milliseconds kCallWithinInterruptCheck{100};

// Runs `call` on a thread of its own and waits for it at most `timeout`: returns what it returned, rethrows what
// it threw, or returns nothing once the timeout passed; `call` then runs on unwatched (see above). Where
// `interrupted` is given it is asked every kCallWithinInterruptCheck while waiting, on the caller's thread, and a
// yes returns nothing at once, as a timeout does: the caller tells the two apart by asking it again.
template <typename Call>
std::optional<CallResult<Call>> call_within(std::chrono::nanoseconds timeout, Call call,
                                            const std::function<bool()>& interrupted = {}) {
  using Result = CallResult<Call>;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto answer = std::make_shared<std::promise<Result>>();
  std::future<Result> result = answer->get_future();
  std::thread([answer, call = std::move(call)]() mutable {
    try {
      if constexpr (std::is_void_v<std::invoke_result_t<Call&>>) {
        call();
        answer->set_value(std::monostate{});
      } else {
        answer->set_value(call());
      }
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const auto until = interrupted ? std::min(deadline, now + kCallWithinInterruptCheck) : deadline;
    if (result.wait_until(until) == std::future_status::ready) return result.get();
    if (until >= deadline || interrupted()) return std::nullopt;
  }
}

}  // namespace tandem
