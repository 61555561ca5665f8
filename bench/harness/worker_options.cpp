#include "bench/harness/worker_options.h"

#include <fstream>

#include "tandem/util/error.h"

namespace tandem::bench {

CLI::Option* add_worker_options_flag(CLI::App& command, std::string& file) {
  return command.add_option(kWorkerOptionsFlag, file, "(internal) run as a worker with the options in this file")
      ->group("");
}

nlohmann::json read_worker_document(const std::string& file) {
  std::ifstream in(file);
  const nlohmann::json document =
      in ? nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false) : nlohmann::json(nlohmann::json::value_t::discarded);
  if (document.is_discarded()) {
    throw InvalidArgument(fmt::format("{} {}: no worker options there; the flag is the drivers' own, drop it",
                                      kWorkerOptionsFlag, file));
  }
  return document;
}

}  // namespace tandem::bench
