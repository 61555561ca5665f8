#pragma once
// Figures over rounds. A benchmark that runs its measurements more than once (--rounds, --repeats) reports each
// figure as the median over them, and each ratio as the median of every round's own ratio: paired, so that a
// machine that drifts between rounds moves both sides of each ratio alike. The drivers keep what each worker
// wrote, one JSON result per round, and take their figures from those with the fields' names.
#include <nlohmann/json.hpp>
#include <vector>

namespace tandem::bench {

double median_of(std::vector<double> values);

// Per round numerator[r] / denominator[r], median over rounds. Both hold the same rounds.
double paired_ratio(const std::vector<double>& numerator, const std::vector<double>& denominator);

// The rounds' values of `field` (0 where a round has none).
std::vector<double> values_of(const std::vector<nlohmann::json>& rounds, const char* field);
double median_over_rounds(const std::vector<nlohmann::json>& rounds, const char* field);
// paired_ratio of `field` over the two rows' rounds.
double paired_ratio(const std::vector<nlohmann::json>& numerator, const std::vector<nlohmann::json>& denominator,
                    const char* field);

}  // namespace tandem::bench
