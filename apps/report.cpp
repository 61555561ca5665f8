// `tandem report RUN_DIR`: writes a run's charts as one HTML page (tandem/monitor/report.h) and prints the
// page's path, so that a script can open it:
//   xdg-open "$(tandem report runs/20250101-120000)"
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "apps/command.h"
#include "tandem/monitor/report.h"

namespace tandem::app {
namespace {

struct ReportFlags {
  std::string run_dir;
  std::string output;
};

int run_report(const ReportFlags& flags) {
  const std::string path = flags.output.empty() ? monitor::default_report_path(flags.run_dir) : flags.output;
  monitor::write_report(flags.run_dir, path);
  std::printf("%s\n", path.c_str());
  return 0;
}

const CommandRegistration kRegisterReport("report", "write a run's charts as one HTML page that opens offline", [](CLI::App& command) {
  auto flags = std::make_shared<ReportFlags>();
  command.add_option("RUN_DIR", flags->run_dir, "run directory written by tandem train (holds metrics.jsonl)")->required();
  command.add_option("--output,-o", flags->output, "HTML file to write (default: RUN_DIR/report.html)")
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            if (!std::filesystem::is_directory(path)) return {};
            return path + " is a folder; give the HTML file to write, e.g. " + path + "/report.html";
          },
          ""));
  command.footer(
      "The page plots loss, learning rate and samples/s per step (steps.jsonl) with each epoch's value\n"
      "(metrics.jsonl), test accuracy per epoch, each rank's step time, and the timeline's means per step\n"
      "(timeline_summary.json, from tandem train --timeline). Files an older run lacks leave their charts out.\n"
      "The charting library (dygraphs) is inside the page: open it in any browser, offline. tandem train\n"
      "writes RUN_DIR/report.html itself at the end of a run.");
  return [flags] { return run_report(*flags); };
});

}  // namespace
}  // namespace tandem::app
