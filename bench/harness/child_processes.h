#pragma once
// What the benchmark drivers need to start their workers (this program again, `tandem run`, mpirun, python3)
// through the shell and read back what each wrote: quoting, a failure that names its command, the result files'
// temporary folder, and the Python that has torch. Shared by every benchmark that starts processes.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::bench {

// `text` as one word for sh: in single quotes, with its own single quotes escaped.
std::string shell_quoted(const std::string& text);

// Runs `command` through the shell. A failure prints the command first, on a line of its own, then throws
// CommError naming `what`, so that the error line stays one readable line.
void run_or_throw(const std::string& command, const std::string& what);

// The JSON that `what` (a worker, a PyTorch script) wrote to `path`; CommError where it wrote none.
nlohmann::json read_result(const std::string& path, const std::string& what);

// The Python, already quoted, that imports torch: $PYTHON first, then Debian's /usr/bin/python3 (python3-torch
// installs there, and a pyenv or venv python3 may shadow it), then python3. UnsupportedError where none does;
// `flag` names what needs it in that message.
std::string find_python(const std::string& flag);

// The same for PyTorch's FSDP2 (`fully_shard`, PyTorch 2.6 and later), where Debian's python3-torch (1.13) has
// none: $PYTHON, /usr/bin/python3, python3, then the checkout's .venv/bin/python (scripts/build --libtorch pypi
// makes it). UnsupportedError naming `flag` where none has it.
std::string find_python_with_fully_shard(const std::string& flag);

// The same for PyTorch's TorchFT (`bench recovery --compare torchft`): $PYTHON, then the checkout's .venv/bin/python
// (scripts/install-python-tools installs torchft there), then python3. UnsupportedError where none has it.
std::string find_python_with_torchft();

// The same for torchvision and PIL (`bench data --compare torchvision`): $PYTHON, /usr/bin/python3 (where
// python3-torchvision installs), then python3. UnsupportedError where none has them.
std::string find_python_with_torchvision();

// The folder that holds the workers' result files ($TMPDIR/tandem_bench_PID), removed however the driver ends
// (a worker failed, the table could not be written), so that no run leaves one behind.
class ResultFolder {
 public:
  ResultFolder();
  ~ResultFolder();
  ResultFolder(const ResultFolder&) = delete;
  ResultFolder& operator=(const ResultFolder&) = delete;

  std::filesystem::path operator/(const std::string& file) const { return path_ / file; }

 private:
  std::filesystem::path path_;
};

}  // namespace tandem::bench
