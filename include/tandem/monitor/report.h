#pragma once
// The run report: one self-contained HTML page with a run's curves, written by `tandem report RUN_DIR` and by
// `tandem train` at a run's end. It draws, from the files in tandem/monitor/run_records.h,
//   loss, learning rate and samples/s per step (steps.jsonl) with the epochs' values (metrics.jsonl);
//   test accuracy per epoch;
//   each rank's step time per step (steps.jsonl's rank_seconds);
//   the timeline's means per step and rank (timeline_summary.json), as a table and bars;
// with dygraphs inlined (tandem/monitor/dygraphs_bundle.h), so it opens offline. Once the page has drawn a
// chart, the chart's element carries data-drawn="1", data-rows and data-series, and <body> counts the charts
// drawn in data-charts-drawn (of data-charts-expected): tests and scripts read these from the DOM.
#include <string>

#include "tandem/monitor/run_records.h"

namespace tandem::monitor {

// RUN_DIR/report.html.
std::string default_report_path(const std::string& run_dir);

// The page for these records. Throws UnsupportedError when this tandem was built without dygraphs.
std::string render_report(const RunRecords& records);

// Reads run_dir's records and writes their page to html_path, atomically (a temporary file renamed over it),
// so a crash never leaves half a report. Throws InvalidArgument for a run dir it cannot read (see
// read_run_records) or for an html_path that is one of the run's own files (anything in run_dir but its
// report.html: a checkpoint, metrics.jsonl), UnsupportedError without dygraphs, Error when html_path cannot be
// written.
void write_report(const std::string& run_dir, const std::string& html_path);

}  // namespace tandem::monitor
