#pragma once
// One rank may fail alone where the others succeed: rank 0 cannot write the run dir, one rank's file is
// damaged. Had it simply thrown, the others would wait for it in their next collective until the timeout. Every
// rank instead runs the step through run_on_all_ranks, which tells each rank whether any failed: the rank that
// failed rethrows its own error, the others throw Error naming it, and all stop together.
#include <exception>
#include <string>
#include <utility>

#include "tandem/comm/communicator.h"

namespace tandem::comm {

// Collective: every rank calls it at the same point with whether it failed (null: it did not). `what` completes
// "rank R failed ...", e.g. "to write the checkpoint". `communicator` null: a world of one.
void agree_or_throw(std::exception_ptr local_failure, Communicator* communicator, const std::string& what);

// Runs `step` on this rank, then agree_or_throw with what it threw.
template <typename Step>
void run_on_all_ranks(Communicator* communicator, const std::string& what, Step&& step) {
  std::exception_ptr failure;
  try {
    std::forward<Step>(step)();
  } catch (...) {
    failure = std::current_exception();
  }
  agree_or_throw(failure, communicator, what);
}

// Rank 0's value of `value` on every rank (`communicator` null: a world of one).
std::string rank0_string(Communicator* communicator, const std::string& value);

}  // namespace tandem::comm
