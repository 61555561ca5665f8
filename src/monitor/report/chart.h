#pragma once
// One chart of the run report (tandem/monitor/report.h): its series of (x, y) points and the words around
// them. The page writes id() and caption() into its HTML and hands spec() to dygraphs through its script
// (report.js), which reads the fields spec() names.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::monitor::report {

// dygraphs takes one row per x value with a column per series, so the rows are the union of the series' x
// values, in order, with NaN (written as null: no point) where a series has none.
class Chart {
 public:
  // `id` names the chart's element in the page; `caption` says where the points come from, under the chart.
  Chart(std::string id, std::string title, std::string xlabel, std::string ylabel, std::string caption);

  // Returns the series' column for add_point. `options` are dygraphs' per-series options.
  size_t add_series(const std::string& name, nlohmann::json options = nlohmann::json::object());
  void add_point(size_t series, int64_t x, double y);

  const std::string& id() const { return id_; }
  const std::string& caption() const { return caption_; }
  bool empty() const { return rows_.empty(); }

  // What the page's script hands to dygraphs.
  nlohmann::json spec() const;

 private:
  std::string id_, title_, xlabel_, ylabel_, caption_;
  std::vector<std::string> names_;
  nlohmann::json series_options_ = nlohmann::json::object();
  std::map<int64_t, std::vector<double>> rows_;
};

}  // namespace tandem::monitor::report
