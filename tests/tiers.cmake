# The test tiers: which label each test carries, so that `ctest -L fast` is the quick run while working and
# `ctest -L processes`, `-L hosts`, ... run the rest (tests/README.md). CTest reads this file when it loads the
# tests (register_tests.cmake), so a change here needs no rebuild.
#
# A test's tier is the first tier below, in this order, that lists a pattern matching its name; a test that no
# pattern matches is `fast`. Each test also carries its folder's name (`ctest -L ddp`). The patterns are gtest
# filter patterns ("Suite.*", "Suite.Test*", "*OnGpu*"), matched after an instantiation's "Name/" prefix, so
# `--gtest_filter` takes them too. They name suites, not folders: a test keeps its tier when its file moves.
#
#   gpu        needs a GPU; skips, saying why, without one. Rule: the name holds "OnGpu".
#   hosts      several hosts on one machine: network namespaces (tests/support/network_namespaces.h; root).
#   python     runs Python from .venv (PyTorch's side of a parity test, TensorBoard's reader).
#   slow       takes over about 20 s on a loaded 2-core machine (tests/README.md has the measured times).
#   processes  starts real processes: the `tandem` program, this test program re-entered as ranks (and the
#              *Worker suites those ranks run, which skip when run alone), mpirun, a browser.
#   fast       everything else: one process, ranks as threads (tests/support/thread_ranks.h).
#
# A new test that starts a process, needs a host, Python or a GPU, or takes long, adds its suite here.
set(tandem_test_tiers gpu hosts python slow processes)

set(tandem_tier_gpu
  "*OnGpu*")

set(tandem_tier_hosts
  "MultiHost.*"
  "MultiHostMpi.*"
  "ElasticMultiHost.*"
  "ElasticSamples.*"
  "ElasticTraining.*")

set(tandem_tier_python
  "PytorchFullyShard.*"
  "PytorchCheckpoints.*"
  "PytorchFullyShardParity.*"
  "FsdpAgainstPytorchDdp.*"
  "TrainTensorBoard.*"
  "RunRecorderTensorBoard.*"
  "SummaryWriter.ScalarsOfSeveralTagsReadBackInTensorBoard"
  "SummaryWriter.SessionStartOfAResumedRunReplacesTheKilledRunsStepsFromThere")

set(tandem_tier_slow
  "ResNetParity.WithBatchNormOnTwoRanks*"
  "RendezvousSimulation.*"
  "ReducerBookkeeping.*"
  "ResNetDdp.SyncBatchNormOnTwoRanks*"
  "KillTrials.*"
  "MpiLargeMessages.*"
  "FsdpShardedCheckpoint.ContinuesBitForBit*"
  "Slurm.*")

set(tandem_tier_processes
  "*Worker.*"
  # the program, through the built `tandem`
  "BadBenchInput.*" "BadBenchRun.*" "BadFsdpBenchInput.*" "BadProgramInput.*" "BadTrainFlags.*" "BadTrainRun.*"
  "BenchMemory.*" "BenchOverheadRun.*" "BenchProgram.*" "BenchTrainCommHook.*" "BenchTrainFsdp.*"
  "FlagChecks.*" "FsdpShardedCheckpoint.*" "FsdpTrain.*" "OptionNames.*" "ProgramHelp.*" "ReportCommand.*"
  "TrainCommand.*" "TrainProcesses.*" "TrainRunOutput.*" "InteractionMatrix.*" "TrainTimeline.*"
  "ProgressBar.*" "SharedRunDir.*" "TandemRun.*" "Restart.*" "ElasticAgent.*"
  "InJobRecovery.*"
  # ranks as processes of the test program
  "BareModule.*" "DdpProcesses.*" "DeadPeer.*" "FsdpDefaultGroup.*" "FsdpMixedPrecision.*" "Join.*"
  "PowerSgdParity.*" "ProcessCollectives.*" "Rendezvous.*" "ZeroProcesses.*"
  # mpirun
  "DdpOverMpi.*" "MpiCollectives.*" "MpiErrorExit.*" "MpiMissingRank.*" "MpiSingleton.*" "MpiTimeout.*"
  # a headless browser
  "ReportTest.*")

# Each tier's patterns as one regular expression: "Suite.Test*" matches the names it names in gtest's filter, with
# or without an instantiation's prefix.
foreach(tier IN LISTS tandem_test_tiers)
  set(alternatives "")
  foreach(pattern IN LISTS tandem_tier_${tier})
    string(REPLACE "." "\\." regex "${pattern}")
    string(REPLACE "*" ".*" regex "${regex}")
    list(APPEND alternatives "${regex}")
  endforeach()
  list(JOIN alternatives "|" alternatives)
  set(tandem_tier_regex_${tier} "(^|/)(${alternatives})$")
endforeach()
