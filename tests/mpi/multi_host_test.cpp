// The mpi backend across two hosts: mpirun in one network namespace starts a rank in each
// (support/network_namespaces.h), reaching the other host through an rsh agent that enters its namespace
// instead of ssh, as a cluster's ssh would enter the other machine. Open MPI's own connections and its
// byte transport stay on the hosts' test subnet. Skipped where namespaces cannot be made (not root).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "support/network_namespaces.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Open MPI calls its rsh agent as `AGENT [OPTIONS] HOST COMMAND...`; this one runs COMMAND in HOST's namespace.
std::string write_rsh_agent(const ScratchDir& dir, const NetworkNamespaces& hosts) {
  const std::string path = dir / "netns-rsh";
  std::ofstream agent(path);
  agent << "#!/bin/sh\n"
        << "while [ \"${1#-}\" != \"$1\" ]; do shift; done\n"
        << "case \"$1\" in\n";
  for (int host = 0; host < 2; ++host) agent << "  " << hosts.address(host) << ") ns=" << hosts.name(host) << ";;\n";
  agent << "  *) echo \"netns-rsh: $1 is not a test host\" >&2; exit 1;;\n"
        << "esac\n"
        << "shift\n"
        << "exec ip netns exec \"$ns\" sh -c \"$*\"\n";
  agent.close();
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(MultiHostMpi, TrainsAcrossTwoHosts) {
  NetworkNamespaces hosts;
  if (!hosts.usable()) GTEST_SKIP() << hosts.unusable_reason();
  ScratchDir dir;
  const std::string data = write_tiny_mnist("multi_host_mpi_data", 256, 64);
  {
    std::ofstream hostfile(dir / "hosts");
    for (int host = 0; host < 2; ++host) hostfile << hosts.address(host) << " slots=1\n";
  }
  const std::string subnet = "10.77.0.0/24";
  ProcessResult result = run_process(
      hosts.on_host(0, {"mpirun", "--allow-run-as-root", "--hostfile", dir / "hosts", "-np", "2", "--mca",
                        "plm_rsh_agent", write_rsh_agent(dir, hosts), "--mca", "btl", "tcp,self", "--mca",
                        "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet, "-x",
                        "OMP_NUM_THREADS=1", tandem_cli(), "train", "--backend", "mpi", "--data", data, "--epochs",
                        "1", "--batch-size", "16", "--threads", "1", "--timeout", "60", "--run-dir", dir / "run"}),
      {}, 120s);
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::regex_search(result.output, std::regex("\n  world size: +2\n"))) << result.output;
  EXPECT_TRUE(std::regex_search(result.output, std::regex("\\[epoch 0\\] loss [0-9.]+ accuracy"))) << result.output;
}

}  // namespace
}  // namespace tandem::testing
