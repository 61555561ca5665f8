#include "chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::monitor::report {
namespace {

using nlohmann::json;

constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

}  // namespace

Chart::Chart(std::string id, std::string title, std::string xlabel, std::string ylabel, std::string caption)
    : id_(std::move(id)),
      title_(std::move(title)),
      xlabel_(std::move(xlabel)),
      ylabel_(std::move(ylabel)),
      caption_(std::move(caption)) {}

size_t Chart::add_series(const std::string& name, json options) {
  names_.push_back(name);
  if (!options.empty()) series_options_[name] = std::move(options);
  return names_.size() - 1;
}

void Chart::add_point(size_t series, int64_t x, double y) {
  std::vector<double>& row = rows_[x];
  row.resize(std::max(row.size(), names_.size()), kNoValue);
  row[series] = y;
}

json Chart::spec() const {
  json rows = json::array();
  for (const auto& [x, values] : rows_) {
    json row = {x};
    for (size_t series = 0; series < names_.size(); ++series) {
      const double value = series < values.size() ? values[series] : kNoValue;
      row.push_back(std::isfinite(value) ? json(value) : json(nullptr));
    }
    rows.push_back(std::move(row));
  }
  json labels = {xlabel_};
  for (const std::string& name : names_) labels.push_back(name);
  return {{"id", id_},       {"title", title_}, {"xlabel", xlabel_},          {"ylabel", ylabel_},
          {"labels", labels}, {"rows", rows},    {"series", series_options_}};
}

}  // namespace tandem::monitor::report
