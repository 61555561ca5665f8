#include "bench/harness/rounds.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::bench {

double median_of(std::vector<double> values) {
  TANDEM_CHECK(!values.empty(), "median of nothing");
  std::sort(values.begin(), values.end());
  size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

double paired_ratio(const std::vector<double>& numerator, const std::vector<double>& denominator) {
  TANDEM_CHECK(numerator.size() == denominator.size() && !numerator.empty(),
               "rows to pair must hold the same rounds: ", numerator.size(), " vs ", denominator.size());
  std::vector<double> ratios;
  for (size_t r = 0; r < numerator.size(); ++r) ratios.push_back(numerator[r] / denominator[r]);
  return median_of(ratios);
}

std::vector<double> values_of(const std::vector<nlohmann::json>& rounds, const char* field) {
  std::vector<double> values;
  for (const auto& round : rounds) values.push_back(round.value(field, 0.0));
  return values;
}

double median_over_rounds(const std::vector<nlohmann::json>& rounds, const char* field) {
  return median_of(values_of(rounds, field));
}

double paired_ratio(const std::vector<nlohmann::json>& numerator, const std::vector<nlohmann::json>& denominator,
                    const char* field) {
  return paired_ratio(values_of(numerator, field), values_of(denominator, field));
}

}  // namespace tandem::bench
