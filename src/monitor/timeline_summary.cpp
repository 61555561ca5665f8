#include "tandem/monitor/timeline_summary.h"

#include <nlohmann/json.hpp>

namespace tandem::monitor {

std::string to_json(const TimelineSummary& summary) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankTimelineSummary& s : summary.ranks) {
    ranks.push_back({{"rank", s.rank},
                     {"steps", s.steps},
                     {"step_ms", s.step_ms},
                     {"forward_ms", s.forward_ms},
                     {"backward_ms", s.backward_ms},
                     {"allreduce_ms", s.allreduce_ms},
                     {"allreduce_hidden_ms", s.allreduce_hidden_ms},
                     {"wait_ms", s.wait_ms},
                     {"optimizer_ms", s.optimizer_ms},
                     {"hidden_share", s.hidden_share()}});
  }
  nlohmann::ordered_json json = {{"trace", summary.trace},
                                 {"first_step", summary.first_step},
                                 {"last_step", summary.last_step},
                                 {"world_size", summary.world_size},
                                 {"ranks", std::move(ranks)}};
  return json.dump(2) + "\n";
}

}  // namespace tandem::monitor
