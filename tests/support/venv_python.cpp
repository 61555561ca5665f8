#include "support/venv_python.h"

#include <filesystem>
#include <stdexcept>

namespace tandem::testing {

std::string checkout_dir() {
  // TANDEM_FIXTURE_DIR is <checkout>/tests/fixtures.
  return std::filesystem::path(TANDEM_FIXTURE_DIR).parent_path().parent_path().string();
}

ProcessResult run_venv_python(const std::string& script, const std::vector<std::string>& args,
                              std::chrono::milliseconds deadline) {
  const std::filesystem::path python = std::filesystem::path(checkout_dir()) / ".venv/bin/python";
  if (!std::filesystem::exists(python)) {
    throw std::runtime_error("no " + python.string() + ": run scripts/install-python-tools");
  }
  std::vector<std::string> argv = {python.string(), (std::filesystem::path(checkout_dir()) / script).string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, deadline);
}

}  // namespace tandem::testing
