// Bad input at the `tandem` program's boundary and to the commands that train nothing (`tandem run`, `report`,
// `export-images`): each ends in one line that names the word, flag or file and says what to do, with exit code 2
// for a wrong command line (1 for a failure while running), and never a LibTorch backtrace (issue 29). A process
// that is no rank says "tandem: error:", where a rank says "[tandem rank r/N] error:".
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <netdb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/error_line.h"
#include "apps/unknown_command.h"
#include "support/bad_input.h"
#include "support/listening_sockets.h"
#include "support/processes.h"
#include "tandem/config.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::app::bad_program_inputs {
namespace {

using testing::BadInput;

// The files the rows refer to, made once for the suite (see BadProgramInput::SetUpTestSuite).
std::string fixture_root() {
  static const std::string root =
      (std::filesystem::temp_directory_path() / ("tandem_bad_program_inputs_" + std::to_string(::getpid()))).string();
  return root;
}
std::string fixture(const std::string& name) { return fixture_root() + "/" + name; }

std::vector<BadInput> bad_inputs() {
  const std::string a_file = fixture("a_file.txt");
  return {
      // The program's first word.
      {"UnknownCommandSuggestsTheNearest", {"trian"},
       {"tandem: error: unknown command 'trian'", "did you mean 'train'?", "bench, convert, export-images, report, run, train"}},
      {"UnknownCommandListsTheCommands", {"xyzzy"}, {"unknown command 'xyzzy'", "the commands are bench"}},
      {"NoCommand", {}, {"tandem: error: a command is required", "train"}},
      {"UnknownFlagBeforeTheCommand", {"--bogus"},
       {"tandem: error: unknown flag '--bogus'", "the commands are bench, convert, export-images, report, run, train"}},
      {"UnknownCommandOfACommand", {"bench", "allreduse"},
       {"bench: unknown command 'allreduse': did you mean 'allreduce'? The commands are allreduce, checkpoint, data, memory, overhead, recovery, rendezvous, train"}},
      {"NoCommandOfACommand", {"bench"}, {"bench: a command is required; the commands are allreduce, checkpoint, data, memory, overhead, recovery, rendezvous, train"}},
      // tandem report
      {"ReportOnAFile", {"report", a_file}, {"tandem: error: ", a_file, "is a file, not a run directory", "--run-dir"}},
      {"ReportOnAFolderWithoutMetrics", {"report", fixture("empty_folder")},
       {"tandem: error: ", fixture("empty_folder/metrics.jsonl") + " not found", "not a run directory"}},
      {"ReportOnAMissingFolder", {"report", fixture("absent")}, {"run directory " + fixture("absent") + " not found"}},
      // A complete last line (it ends in its newline) is no line a killed run was writing: it was called torn.
      {"ReportOnAnInvalidLastLine", {"report", fixture("invalid_last_line")},
       {"tandem: error: ", fixture("invalid_last_line/metrics.jsonl") + " line 2: not valid JSON",
        "fix or delete the line"}},
      {"ReportOutputIsAFolder", {"report", fixture("empty_folder"), "-o", fixture("empty_folder")},
       {"tandem: error: --output", fixture("empty_folder") + " is a folder; give the HTML file to write"}},
      {"ReportOutputIsACheckpointOfTheRun",
       {"report", fixture("a_run"), "-o", fixture("a_run/checkpoint-0001-00000000.safetensors")},
       {"tandem: error: ", fixture("a_run/checkpoint-0001-00000000.safetensors"),
        "is the run's own file checkpoint-0001-00000000.safetensors", "outside the run dir"}},
      // tandem run: ranges checked before anything starts
      {"RunTooManyWorkers", {"run", "--nproc-per-node", "100000", "--", "true"},
       {"tandem: error: --nproc-per-node: must be a whole number from 1 to 1024, not 100000"}},
      {"RunZeroWorkers", {"run", "--nproc-per-node", "0", "--", "true"}, {"--nproc-per-node: must be a whole number from 1 to", "not 0"}},
      {"RunZeroNodes", {"run", "--nnodes", "0", "--", "true"}, {"--nnodes '0' is not a number of nodes", "MIN:MAX"}},
      // tandem run: elastic jobs (--rdzv-backend c10d), refused before any store is reached
      {"RunNodeRangeUpsideDown", {"run", "--nnodes", "3:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400",
                                  "--rdzv-id", "job", "--", "true"},
       {"--nnodes 3:2", "least number of nodes is above the most", "2:3"}},
      {"RunNodeRangeWithoutRendezvous", {"run", "--nnodes", "2:3", "--", "true"},
       {"--nnodes 2:3 is an elastic job", "--rdzv-backend c10d", "--rdzv-endpoint"}},
      {"RunUnknownRendezvousBackend", {"run", "--nnodes", "2:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:1",
                                       "--rdzv-id", "job", "--", "true"},
       {"--rdzv-backend 'etcd' is not one tandem run knows", "c10d"}},
      {"RunNodeRankWithRendezvous", {"run", "--nnodes", "2:3", "--node-rank", "1", "--rdzv-backend", "c10d",
                                     "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "job", "--", "true"},
       {"--node-rank 1 with --rdzv-backend c10d", "leave --node-rank out"}},
      {"RunRendezvousWithoutEndpoint", {"run", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-id", "job", "--", "true"},
       {"--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT"}},
      {"RunRendezvousEndpointWithoutPort", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                            "node0:", "--rdzv-id", "job", "--", "true"},
       {"--rdzv-endpoint 'node0:' ends in ':' without a port", "HOST:PORT"}},
      {"RunRendezvousEndpointBadPort", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                        "node0:99999", "--rdzv-id", "job", "--", "true"},
       {"--rdzv-endpoint 'node0:99999' has port '99999', not 1..65535"}},
      {"RunRendezvousConfUnknownKey", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                       "node0:29400", "--rdzv-id", "job", "--rdzv-conf", "timeout=3", "--", "true"},
       {"--rdzv-conf 'timeout=3': unknown key 'timeout'", "last_call_timeout"}},
      {"RunRendezvousConfBadValue", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                     "node0:29400", "--rdzv-id", "job", "--rdzv-conf", "last_call_timeout=-1", "--", "true"},
       {"--rdzv-conf 'last_call_timeout=-1': 'last_call_timeout=-1' needs seconds"}},
      {"RunRendezvousConfOneAttempt", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                       "node0:29400", "--rdzv-id", "job", "--rdzv-conf", "keep_alive_max_attempt=1", "--",
                                       "true"},
       {"--rdzv-conf 'keep_alive_max_attempt=1'", "needs a whole number from 2 to 1000"}},
      {"RunRendezvousWithoutId", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400",
                                  "--", "true"},
       {"--rdzv-backend c10d needs --run-id"}},
      {"RunRendezvousWithMasterAddr", {"run", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                       "node0:29400", "--rdzv-id", "job", "--master-addr", "10.0.0.1", "--", "true"},
       {"--master-addr with --rdzv-backend c10d", "--rdzv-endpoint"}},
      {"RunNegativeNodeRank", {"run", "--node-rank", "-1", "--", "true"}, {"--node-rank: must be a whole number from 0 to", "not -1"}},
      {"RunNodeRankPastTheNodes", {"run", "--nnodes", "2", "--node-rank", "2", "--master-addr", "10.0.0.1", "--", "true"},
       {"--node-rank 2 is outside 0..1"}},
      {"RunMasterPortOutOfRange", {"run", "--master-port", "70000", "--", "true"}, {"--master-port: must be a whole number from 0 to 65535, not 70000"}},
      {"RunNegativeGracePeriod", {"run", "--grace-period", "-1", "--", "true"}, {"--grace-period: must be between 0 and 86400, not -1"}},
      {"RunGracePeriodNotANumber", {"run", "--grace-period", "nan", "--", "true"}, {"--grace-period: must be between 0 and 86400, not nan"}},
      {"RunInfiniteGracePeriod", {"run", "--grace-period", "inf", "--", "true"}, {"--grace-period: must be between 0 and 86400, not inf"}},
      {"RunNegativeMaxRestarts", {"run", "--max-restarts", "-1", "--", "true"}, {"--max-restarts: must be a whole number from 0 to 1000, not -1"}},
      {"RunHugeMaxRestarts", {"run", "--max-restarts", "1000000", "--", "true"}, {"--max-restarts: must be a whole number from 0 to 1000, not 1000000"}},
      // tandem run: other bad values and commands
      {"RunNothingAfterTheSeparator", {"run", "--"}, {"tandem: error: no command to run"}},
      {"RunCommandBeforeNoSeparator", {"run", "true"}, {"put the command after `--`"}},
      {"RunCommandThatDoesNotExist", {"run", "--", "tandem-no-such-command"},
       {"cannot execute 'tandem-no-such-command'", "not found in PATH"}, 127},
      {"RunGpusGarbage", {"run", "--gpus", "x", "--", "true"}, {"--gpus 'x'", "not a GPU index"}},
      {"RunMasterAddrGarbage", {"run", "--master-addr", "garbage", "--", "true"},
       {"--master-addr garbage", "loopback address"}},
      {"RunLogDirUnderAFile", {"run", "--log-dir", a_file + "/logs", "--", "true"},
       {"tandem: error: --log-dir '" + a_file + "/logs' cannot be created", "Not a directory"}},
      // tandem export-images
      {"ExportZeroPerClass", {"export-images", fixture("export_out"), "--per-class", "0"},
       {"--per-class: must be a whole number from 1 to", "not 0"}},
      {"ExportNegativePerClass", {"export-images", fixture("export_out"), "--per-class", "-1"},
       {"--per-class: must be a whole number from 1 to", "not -1"}},
      {"ExportFromAMissingSource", {"export-images", fixture("export_out"), "--source", fixture("absent")},
       {"tandem: error: --source " + fixture("absent") + " is not a folder", "dataset-fashion-mnist"}},
      {"ExportFromASourceWithoutLabels", {"export-images", fixture("export_out"), "--source", fixture("images_only")},
       {"--source " + fixture("images_only") + " holds no train-labels-idx1-ubyte[.gz]", "dataset-fashion-mnist"}},
      {"ExportAnUnknownSet", {"export-images", fixture("export_out"), "--source", fixture("images_only"), "--sets", "foo"},
       {"holds no foo-images-idx3-ubyte[.gz]; the sets it holds are train: name those with --sets"}},
      {"ExportIntoAFile", {"export-images", a_file}, {a_file + " is a file, not a folder"}},
      // tandem convert
      {"ConvertWithoutFormat", {"convert", a_file, fixture("converted")}, {"--format is required"}},
      {"ConvertToAnUnknownFormat", {"convert", a_file, fixture("converted"), "--format", "onnx"},
       {"--format: onnx not in {dcp,safetensors}"}},
      {"ConvertAMissingSource", {"convert", fixture("absent"), fixture("converted"), "--format", "dcp"},
       {"source: Path does not exist: " + fixture("absent")}},
      {"ConvertAShardSizeWithoutNumber", {"convert", a_file, fixture("converted"), "--format", "safetensors",
                                          "--max-shard-size", "GB"},
       {"--max-shard-size: must be a size such as 500MB, 5GB or 2GiB, not GB"}},
      {"ConvertOntoAnExistingFolder", {"convert", a_file, fixture("empty_folder"), "--format", "dcp"},
       {fixture("empty_folder") + " exists already: it is never overwritten"}},
      {"ConvertSomethingThatIsNoCheckpoint", {"convert", a_file, fixture("converted"), "--format", "dcp"},
       {a_file + ":", "safetensors"}},
  };
}

class BadProgramInput : public ::testing::TestWithParam<BadInput> {
 public:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(fixture("empty_folder"));
    std::filesystem::create_directories(fixture("images_only"));
    std::ofstream(fixture("a_file.txt")) << "not a folder\n";
    std::filesystem::create_directories(fixture("a_run"));
    std::ofstream(fixture("a_run/metrics.jsonl")) << "";
    std::ofstream(fixture("a_run/checkpoint-0001-00000000.safetensors")) << "a checkpoint";
    std::ofstream(fixture("images_only/train-images-idx3-ubyte.gz")) << "";
    std::filesystem::create_directories(fixture("invalid_last_line"));
    std::ofstream(fixture("invalid_last_line/metrics.jsonl"))
        << R"({"epoch":0,"loss":0.5,"lr":0.1,"samples_per_second":10,"train_seconds":1,"step":4})" << "\n"
        << "{\"epoch\":1,\"loss\":0.4,}\n";
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(fixture_root()); }
};

// Nothing is written before a refusal: the export rows name their output folder, which must not appear.
TEST_P(BadProgramInput, IsRefusedInOneLine) {
  testing::expect_one_line_refusal(GetParam());
  EXPECT_FALSE(std::filesystem::exists(fixture("export_out"))) << "the refused command created its output folder";
  std::ifstream checkpoint(fixture("a_run/checkpoint-0001-00000000.safetensors"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(checkpoint), {}), "a checkpoint") << "the report overwrote it";
}

INSTANTIATE_TEST_SUITE_P(Table, BadProgramInput, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

// Under `tandem run` no MPI launcher started the ranks: each refuses before MPI starts, so Open MPI prints
// neither its error log nor its MPI_ABORT banner.
TEST_F(BadProgramInput, MpiBackendUnderTandemRunIsRefusedBeforeMpiStarts) {
  if (!TANDEM_HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const BadInput input{"MpiUnderTandemRun",
                       {"run", "--nproc-per-node", "2", "--", testing::tandem_cli(), "train", "--backend", "mpi",
                        "--epochs", "1"},
                       {"[tandem rank", "error: --backend mpi needs its 2 ranks started by mpirun", "--backend gloo"},
                       2,
                       /*only_line=*/false};
  const testing::ProcessResult result = testing::expect_one_line_refusal(input);
  EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("ORTE_ERROR_LOG"), std::string::npos) << result.output;
}

// .invalid is reserved never to name a host (RFC 2606), but only a resolver that answers says so at once: one
// that cannot reach its name server answers "try again" after its timeout, and the launcher then leaves the
// address to the workers' rendezvous. The row needs the definite answer, so it asks the resolver first.
TEST_F(BadProgramInput, MasterAddrThatNamesNoHostIsRefusedBeforeAnyWorker) {
  addrinfo* found = nullptr;
  const int lookup = getaddrinfo("garbage.invalid", nullptr, nullptr, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (lookup != EAI_NONAME) GTEST_SKIP() << "this resolver gives no definite answer for garbage.invalid";
  testing::expect_one_line_refusal({"RunMasterAddrThatNamesNoHost",
                                    {"run", "--nnodes", "2", "--master-addr", "garbage.invalid", "--", "true"},
                                    {"tandem: error: --master-addr garbage.invalid names no host",
                                     "give node 0's address"}});
}

// Before LibTorch 2.8 `tandem run` keeps its workers' rendezvous store in a folder under TMPDIR (from 2.8 it
// serves a TCP store from its own socket and needs no folder).
bool run_keeps_its_store_in_tmpdir() { return !TANDEM_TORCH_VERSION_AT_LEAST(2, 8); }

// Whether a test may mount a small tmpfs at `folder` (made here) in a mount namespace of its own: as root only.
bool can_mount_a_tmpfs_at(const std::string& folder) {
  std::filesystem::create_directories(folder);
  return testing::run_process({"unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs " + folder}, {},
                              std::chrono::seconds(30))
             .exit_code == 0;
}

// `command` run by sh in a mount namespace of its own, with TMPDIR on a tmpfs of `size` mounted at `folder`,
// after `prepare` (whose failure, a full tmpfs, is expected).
testing::ProcessResult run_with_tmpdir_on_a_tmpfs(const std::string& folder, const std::string& size,
                                                  const std::string& prepare, const std::string& command) {
  const std::string script = "mount -t tmpfs -o size=" + size + " tmpfs " + folder + " && (" + prepare +
                             "; true) && TMPDIR=" + folder + " exec " + command;
  return testing::run_process({"unshare", "-m", "sh", "-c", script}, {}, std::chrono::seconds(120));
}

// The folder's own error was "filesystem error: temp_directory_path: No such file or directory", naming neither
// TMPDIR nor the folder.
TEST_F(BadProgramInput, RunWithAMissingTmpdirNamesIt) {
  if (!run_keeps_its_store_in_tmpdir()) GTEST_SKIP() << "this LibTorch's tandem run keeps no store in TMPDIR";
  testing::expect_one_line_refusal({"RunTmpdirMissing",
                                    {"run", "--nproc-per-node", "2", "--", "true"},
                                    {"tandem: error: TMPDIR=" + fixture("absent") + " is not a folder",
                                     "create that folder, or point TMPDIR at one"},
                                    2,
                                    /*only_line=*/true,
                                    {{"TMPDIR", fixture("absent")}}});
}

// A full TMPDIR (a 64 KiB tmpfs, filled, in a mount namespace of its own): every worker's FileStore threw
// std::system_error from a destructor, and std::terminate's report was each rank's last word.
TEST_F(BadProgramInput, RunWithAFullTmpdirIsOneLineBeforeAnyWorker) {
  if (!run_keeps_its_store_in_tmpdir()) GTEST_SKIP() << "this LibTorch's tandem run keeps no store in TMPDIR";
  const std::string full = fixture("full_tmpdir");
  if (!can_mount_a_tmpfs_at(full)) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here (needs root)";
  const std::string tandem = testing::tandem_cli();
  const testing::ProcessResult result = run_with_tmpdir_on_a_tmpfs(
      full, "64k", "dd if=/dev/zero of=" + full + "/fill bs=1k count=128 2>/dev/null",
      tandem + " run --nproc-per-node 2 -- " + tandem + " train --data " + fixture("absent") + " --timeout 10 --run-dir " +
          fixture("full_tmpdir_run"));
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
  EXPECT_EQ(result.output, "tandem: error: " + full + " has no room for tandem run's rendezvous store (1 MiB; No "
                           "space left on device): free space there, or point TMPDIR at another folder\n");
}

// A TMPDIR that fills after the launcher's check, while its workers run (here each fills what is left before it
// trains): the workers' FileStore threw std::system_error from the write that found no room, and again from its
// destructor at the rank's exit, so std::terminate's report ended every rank.
TEST_F(BadProgramInput, RunWhoseTmpdirFillsWhileItsWorkersRunIsOneLine) {
  if (!run_keeps_its_store_in_tmpdir()) GTEST_SKIP() << "this LibTorch's tandem run keeps no store in TMPDIR";
  const std::string filling = fixture("filling_tmpdir");
  if (!can_mount_a_tmpfs_at(filling)) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here (needs root)";
  const std::string tandem = testing::tandem_cli();
  // 2 MiB: room for the launcher's check of 1 MiB, then the workers fill the rest.
  const std::string worker = "dd if=/dev/zero of=" + filling + "/fill-$RANK bs=64k 2>/dev/null; exec " + tandem +
                             " train --data " + fixture("absent") + " --timeout 10 --run-dir " +
                             fixture("filling_tmpdir_run");
  const testing::ProcessResult result =
      run_with_tmpdir_on_a_tmpfs(filling, "2m", "true", tandem + " run --nproc-per-node 2 -- sh -c '" + worker + "'");
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("error: " + filling + " (TMPDIR) is full: tandem run's workers keep their rendezvous "
                               "store there, and it could not grow (No space left on device); free space in " +
                               filling + ", or point TMPDIR at a folder with room"),
            std::string::npos)
      << result.output;
}

// A port where something accepts connections and never answers: c10d's store client waited for its answer
// whatever --timeout said, and the rank hung.
TEST_F(BadProgramInput, MasterPortThatNeverAnswersFailsWithinTheTimeout) {
  testing::HeldPort silent;
  const testing::ProcessResult result = testing::expect_one_line_refusal(
      {"SilentMasterPort",
       {"train", "--data", fixture("absent"), "--timeout", "2", "--run-dir", fixture("silent_port_run")},
       {"[tandem rank 1/2] error: rank 1 connected to the rendezvous store's address but got no answer within 2 s",
        "check that MASTER_ADDR and MASTER_PORT name rank 0's rendezvous store"},
       1,
       /*only_line=*/true,
       {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(silent.port())}}});
  EXPECT_FALSE(result.timed_out);
}

// A port of another service that greets half a second after the connection (SSH, SMTP): c10d's store client
// read the greeting as a length, and LibTorch 1.13's died of std::bad_alloc.
TEST_F(BadProgramInput, MasterPortOfAServiceThatGreetsLateIsOneLine) {
  testing::GreetingPort ssh("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", std::chrono::milliseconds(500));
  const testing::ProcessResult result = testing::expect_one_line_refusal(
      {"GreetingMasterPort",
       {"train", "--data", fixture("absent"), "--timeout", "5", "--run-dir", fixture("greeting_port_run")},
       {"[tandem rank 1/2] error: rank 1 found no rendezvous store at 127.0.0.1:" + std::to_string(ssh.port()) +
            ": it answered as no c10d store does (\"SSH-2.0-OpenSSH_9.2p1 De...\"): another service listens there",
        "check that MASTER_ADDR and MASTER_PORT name rank 0's rendezvous store"},
       1,
       /*only_line=*/true,
       {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(ssh.port())}}});
  EXPECT_FALSE(result.timed_out);
}

// An address that names no host: c10d logged a warning for every attempt to reach it, one a second until the
// timeout, before the rank's own error line.
TEST_F(BadProgramInput, MasterAddrThatNamesNoHostIsOneLineFromTheRank) {
  addrinfo* found = nullptr;
  const int lookup = getaddrinfo("garbage.invalid", nullptr, nullptr, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (lookup != EAI_NONAME) GTEST_SKIP() << "this resolver gives no definite answer for garbage.invalid";
  testing::expect_one_line_refusal(
      {"UnresolvableMasterAddr",
       {"train", "--data", fixture("absent"), "--timeout", "3", "--run-dir", fixture("unresolvable_run")},
       {"[tandem rank 1/2] error: rank 1 could not reach the rendezvous master at garbage.invalid:29999 within 3 s"},
       1,
       /*only_line=*/true,
       {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "garbage.invalid"}, {"MASTER_PORT", "29999"}}});
}

// `tandem run --help` offered --nproc-per-node up to 2^31 - 1 where 1024 is the limit: each flag's help shows the
// range its check accepts.
TEST(ProgramHelp, RunShowsTheWorkersItAccepts) {
  const testing::ProcessResult result = testing::run_process({testing::tandem_cli(), "run", "--help"}, {},
                                                             std::chrono::seconds(60));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const size_t flag = result.output.find("--nproc-per-node");
  ASSERT_NE(flag, std::string::npos) << result.output;
  const std::string line = result.output.substr(flag, result.output.find('\n', flag) - flag);
  EXPECT_NE(line.find("1 to 1024"), std::string::npos) << line;
}

// LibTorch's errors reach main() with a backtrace in what(); the line keeps the message only. Most bad values are
// refused before they reach LibTorch, so the mapping is checked here on errors made for the purpose.
TEST(ErrorLine, DropsLibTorchsBacktrace) {
  try {
    TORCH_CHECK(false, "`device` cuda:7 is not available");
  } catch (const c10::Error& error) {
    const std::string line = error_line(error);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_EQ(line.find("Exception raised from"), std::string::npos) << line;
    EXPECT_NE(line.find("--device cuda:7 is not available"), std::string::npos) << line;
  }
}

TEST(ErrorLine, DropsTheBacktraceOfAWrappedLibTorchError) {
  try {
    TORCH_CHECK(false, "connection refused");
  } catch (const c10::Error& error) {
    EXPECT_EQ(error_line(CommError(std::string("cannot reach the store: ") + error.what())),
              "cannot reach the store: connection refused");
  }
}

TEST(ErrorLine, JoinsContextLinesIntoOne) {
  c10::Error error(c10::SourceLocation{__func__, __FILE__, __LINE__}, "the message");
  error.add_context("first context");
  error.add_context("second context");
  EXPECT_EQ(error_line(error), "the message; first context; second context");
}

TEST(UnknownCommand, SuggestsOnlyANearCommand) {
  const std::vector<std::string> commands = {"train", "run", "report"};
  EXPECT_EQ(unknown_command_line("rn", commands),
            "unknown command 'rn': did you mean 'run'? The commands are report, run, train");
  EXPECT_EQ(unknown_command_line("reprot", commands),
            "unknown command 'reprot': did you mean 'report'? The commands are report, run, train");
  EXPECT_EQ(unknown_command_line("fit", commands), "unknown command 'fit'; the commands are report, run, train");
}

}  // namespace
}  // namespace tandem::app::bad_program_inputs
