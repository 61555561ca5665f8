#pragma once
// Tests that ask PyTorch or TensorBoard themselves run a script of the checkout with the checkout's own
// .venv/bin/python, which scripts/install-python-tools fills (TensorBoard, and PyPI's torch through
// scripts/install-libtorch).
#include <chrono>
#include <string>
#include <vector>

#include "support/processes.h"

namespace tandem::testing {

// The checkout's root (the folder holding tests/).
std::string checkout_dir();

// Runs .venv/bin/python CHECKOUT/script args... with a deadline. Throws, failing the calling test rather than
// skipping it, when .venv/bin/python is missing: the one line says to run scripts/install-python-tools.
ProcessResult run_venv_python(const std::string& script, const std::vector<std::string>& args,
                              std::chrono::milliseconds deadline);

}  // namespace tandem::testing
