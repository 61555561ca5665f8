#include "tandem/util/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::fault {
namespace {

struct KillAt {
  std::string point;
  int rank = 0;
  long long count = 0;
};

// Every POINT:RANK:COUNT of TANDEM_KILL_AT's comma-separated list; none in a process that must run on.
std::vector<KillAt> read_kill_at() {
  std::vector<KillAt> kills;
  const char* value = std::getenv("TANDEM_KILL_AT");
  if (!value || !*value) return kills;
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt && std::string(attempt) != "0") return kills;
  // In-job recovery's replacement of the killed worker (comm/membership.h's variable) runs on too.
  const char* replacement = std::getenv("TANDEM_RECOVERY_REPLACEMENT");
  if (replacement && std::string(replacement) == "1") return kills;
  std::stringstream list(value);
  std::string entry;
  while (std::getline(list, entry, ',')) {
    KillAt kill_at;
    char point[32];
    if (std::sscanf(entry.c_str(), "%31[a-z-]:%d:%lld", point, &kill_at.rank, &kill_at.count) != 3 ||
        (std::string(point) != "step" && std::string(point) != "safetensors-write" &&
         std::string(point) != "heal-send")) {
      throw InvalidArgument(std::string("TANDEM_KILL_AT must be a comma-separated list of step:RANK:COUNT, "
                                        "safetensors-write:RANK:COUNT or heal-send:RANK:COUNT, got '") +
                            value + "'");
    }
    kill_at.point = point;
    kills.push_back(kill_at);
  }
  return kills;
}

struct NanAt {
  int rank = -1;  // -1: no injection
  long long step = -1;
};

NanAt read_nan_at() {
  NanAt nan_at;
  const char* value = std::getenv("TANDEM_INJECT_NAN_AT_STEP");
  if (!value) return nan_at;
  if (std::sscanf(value, "%d:%lld", &nan_at.rank, &nan_at.step) != 2) {
    throw InvalidArgument(std::string("TANDEM_INJECT_NAN_AT_STEP must be RANK:STEP, got '") + value + "'");
  }
  return nan_at;
}

int own_rank() {
  const char* rank = std::getenv("RANK");
  return rank ? std::atoi(rank) : 0;
}

}  // namespace

void kill_point(std::string_view point, int64_t count) {
  static const std::vector<KillAt> kills = read_kill_at();
  static const int rank = own_rank();
  for (const KillAt& kill_at : kills) {
    if (kill_at.point == point && kill_at.rank == rank && kill_at.count == count) ::kill(::getpid(), SIGKILL);
  }
}

bool nan_loss_at(int rank, int64_t step) {
  static const NanAt nan_at = read_nan_at();
  return nan_at.rank == rank && nan_at.step == step;
}

}  // namespace tandem::fault
