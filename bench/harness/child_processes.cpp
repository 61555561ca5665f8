#include "bench/harness/child_processes.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::bench {

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void run_or_throw(const std::string& command, const std::string& what) {
  const int status = std::system(command.c_str());
  if (status == 0) return;
  fmt::print(stderr, "# the command that failed: {}\n", command);
  if (WIFEXITED(status)) {
    throw CommError(fmt::format("{} failed with exit code {}; see its output above", what, WEXITSTATUS(status)));
  }
  throw CommError(fmt::format("{} was ended by signal {}; see its output above", what,
                              WIFSIGNALED(status) ? WTERMSIG(status) : status));
}

nlohmann::json read_result(const std::string& path, const std::string& what) {
  std::ifstream file(path);
  if (!file) throw CommError(fmt::format("{} wrote no result to {}; see its output above", what, path));
  try {
    return nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception&) {
    throw CommError(fmt::format("{} wrote no result ({} is empty or cut short); see its output above", what, path));
  }
}

namespace {

// The first of $PYTHON and `candidates` that runs `statement`, quoted; "" where none does.
std::string first_python_running(std::vector<std::string> candidates, const std::string& statement) {
  if (const char* chosen = std::getenv("PYTHON")) candidates.insert(candidates.begin(), chosen);
  for (const std::string& candidate : candidates) {
    const std::string probe = fmt::format("{} -c {} >/dev/null 2>&1", shell_quoted(candidate), shell_quoted(statement));
    if (std::system(probe.c_str()) == 0) return shell_quoted(candidate);
  }
  return {};
}

}  // namespace

std::string find_python(const std::string& flag) {
  std::string python = first_python_running({"/usr/bin/python3", "python3"}, "import torch");
  if (!python.empty()) return python;
  throw UnsupportedError(fmt::format(
      "{} needs PyTorch for Python, which is not installed; on Debian: apt-get install -y python3-torch (the bench "
      "installs nothing itself)",
      flag));
}

std::string find_python_with_fully_shard(const std::string& flag) {
  std::string python = first_python_running({"/usr/bin/python3", "python3", ".venv/bin/python"},
                                            "from torch.distributed.fsdp import fully_shard");
  if (!python.empty()) return python;
  throw UnsupportedError(fmt::format(
      "{} needs PyTorch 2.6 or later for Python (FSDP2's fully_shard), which no python3 here has; make .venv with "
      "scripts/build --libtorch pypi or set PYTHON to a Python that has it",
      flag));
}

std::string find_python_with_torchft() {
  std::string python = first_python_running({".venv/bin/python", "python3"}, "import torchft");
  if (!python.empty()) return python;
  throw UnsupportedError(
      "--compare torchft needs PyTorch's TorchFT for Python, which no python here has; scripts/install-python-tools "
      "installs it into .venv, or set PYTHON to a Python that has it");
}

std::string find_python_with_torchvision() {
  std::string python = first_python_running({"/usr/bin/python3", "python3"}, "import torchvision, PIL");
  if (!python.empty()) return python;
  throw UnsupportedError(
      "--compare torchvision needs torchvision and PIL for Python, which are not installed; on Debian: apt-get "
      "install -y python3-torchvision python3-pil (or scripts/install-deps)");
}

ResultFolder::ResultFolder()
    : path_(std::filesystem::temp_directory_path() / fmt::format("tandem_bench_{}", ::getpid())) {
  std::filesystem::create_directories(path_);
}

ResultFolder::~ResultFolder() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace tandem::bench
