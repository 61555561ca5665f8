#include "support/processes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace tandem::testing {
namespace {

std::string self_executable() {
  char path[4096];
  ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, static_cast<size_t>(length));
}

struct Child {
  pid_t pid = -1;
  int output_fd = -1;
  ProcessResult result;
  bool exited = false;
};

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(fds[1]);
  Child child;
  child.pid = pid;
  child.output_fd = fds[0];
  return child;
}

// Reads every child's output until all have exited and closed their pipes, or the deadline passes.
void supervise(std::vector<Child>& children, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  bool killed = false;
  while (true) {
    std::vector<pollfd> fds;
    for (auto& child : children) {
      if (child.output_fd >= 0) fds.push_back({child.output_fd, POLLIN, 0});
    }
    for (auto& child : children) {
      if (child.exited) continue;
      int status = 0;
      if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
        child.exited = true;
        if (WIFEXITED(status)) child.result.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) child.result.term_signal = WTERMSIG(status);
      }
    }
    bool all_exited = true;
    for (auto& child : children) all_exited = all_exited && child.exited;
    if (all_exited && fds.empty()) return;
    if (!killed && std::chrono::steady_clock::now() >= end) {
      for (auto& child : children) {
        if (!child.exited) child.result.timed_out = true;
        ::kill(-child.pid, SIGKILL);
      }
      killed = true;
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    ::poll(fds.data(), fds.size(), 50);
    for (auto& child : children) {
      if (child.output_fd < 0) continue;
      char buffer[4096];
      ssize_t got = ::read(child.output_fd, buffer, sizeof(buffer));
      if (got > 0) {
        child.result.output.append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(child.output_fd);
        child.output_fd = -1;
      }
    }
  }
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds deadline) {
  std::vector<Child> children{spawn(argv, env)};
  ::fcntl(children[0].output_fd, F_SETFL, O_NONBLOCK);
  supervise(children, deadline);
  return children[0].result;
}

BackgroundProcess::BackgroundProcess(const std::vector<std::string>& argv,
                                     const std::map<std::string, std::string>& env) {
  Child child = spawn(argv, env);
  pid_ = child.pid;
  output_fd_ = child.output_fd;
  ::fcntl(output_fd_, F_SETFL, O_NONBLOCK);
}

BackgroundProcess::~BackgroundProcess() {
  if (finished_) return;
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  ::close(output_fd_);
}

ProcessResult BackgroundProcess::finish(std::chrono::milliseconds deadline) {
  std::vector<Child> children(1);
  children[0].pid = pid_;
  children[0].output_fd = output_fd_;
  supervise(children, deadline);
  finished_ = true;
  return children[0].result;
}

std::vector<ProcessResult> run_worker_ranks(int world_size, const std::string& worker_test,
                                            std::chrono::milliseconds deadline,
                                            const std::map<std::string, std::string>& env) {
  std::string port = std::to_string(free_port());
  std::vector<Child> children;
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string> rank_env = env;
    rank_env.emplace("RANK", std::to_string(rank));
    rank_env.emplace("WORLD_SIZE", std::to_string(world_size));
    rank_env.emplace("LOCAL_RANK", std::to_string(rank));
    rank_env.emplace("LOCAL_WORLD_SIZE", std::to_string(world_size));
    rank_env.emplace("MASTER_ADDR", "127.0.0.1");
    rank_env.emplace("MASTER_PORT", port);
    rank_env.emplace("OMP_NUM_THREADS", "1");
    rank_env["TANDEM_TEST_WORKER"] = "1";
    children.push_back(spawn({self_executable(), "--gtest_filter=" + worker_test}, rank_env));
    ::fcntl(children.back().output_fd, F_SETFL, O_NONBLOCK);
  }
  supervise(children, deadline);
  std::vector<ProcessResult> results;
  for (auto& child : children) results.push_back(child.result);
  return results;
}

ProcessResult run_launched_worker_ranks(const std::vector<std::string>& launcher_args, const std::string& worker_test,
                                        std::chrono::milliseconds deadline,
                                        const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> worker_env = env;
  worker_env["TANDEM_TEST_WORKER"] = "1";
  worker_env.emplace("OMP_NUM_THREADS", "1");
  std::vector<std::string> argv{tandem_cli(), "run"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.insert(argv.end(), {"--", self_executable(), "--gtest_filter=" + worker_test});
  return run_process(argv, worker_env, deadline);
}

ProcessResult run_mpirun_ranks(int world_size, const std::string& worker_test, std::chrono::milliseconds deadline,
                               const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> worker_env = env;
  worker_env["TANDEM_TEST_WORKER"] = "1";
  worker_env.emplace("OMP_NUM_THREADS", "1");
  // mpirun hands its ranks a terminal, which would colour their gtest lines.
  worker_env.emplace("GTEST_COLOR", "no");
  // Containers often forbid the cross-process memory attach (CMA) that Open MPI's shared-memory transport
  // tries first; plain copies through the shared segment work everywhere.
  worker_env.emplace("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
  return run_process({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(world_size),
                      self_executable(), "--gtest_filter=" + worker_test},
                     worker_env, deadline);
}

ProcessResult run_worker_process(const std::string& worker_test, const std::map<std::string, std::string>& env,
                                 std::chrono::milliseconds deadline) {
  std::map<std::string, std::string> worker_env = env;
  worker_env["TANDEM_TEST_WORKER"] = "1";
  return run_process({self_executable(), "--gtest_filter=" + worker_test}, worker_env, deadline);
}

bool is_worker_process() { return std::getenv("TANDEM_TEST_WORKER") != nullptr; }

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free port on 127.0.0.1");
  }
  int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::string tandem_cli() { return TANDEM_CLI_PATH; }

std::string kill_all_and_collect(std::map<int, std::unique_ptr<BackgroundProcess>>& hosts,
                                 std::chrono::milliseconds deadline) {
  std::string outputs;
  for (auto& [host, process] : hosts) {
    if (!process) continue;
    ::kill(-process->pid(), SIGKILL);
    outputs += "host " + std::to_string(host) + ":\n" + process->finish(deadline).output;
    process.reset();
  }
  return outputs;
}

}  // namespace tandem::testing
