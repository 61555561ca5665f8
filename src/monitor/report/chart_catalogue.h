#pragma once
// Which charts a run report holds and which records fill them (tandem/monitor/run_records.h): training loss,
// test accuracy, learning rate, throughput and each rank's step time. A chart its records leave empty is left
// out of the page.
#include <string>
#include <vector>

#include "chart.h"
#include "tandem/monitor/run_records.h"

namespace tandem::monitor::report {

// Every chart the records can fill, in the page's order; appends to `notes` a note for each one they cannot.
std::vector<Chart> report_charts(const RunRecords& records, std::vector<std::string>& notes);

// The ranks the run had, as far as its records show: the timeline's, or the most step times a step holds.
size_t world_size(const RunRecords& records);

}  // namespace tandem::monitor::report
