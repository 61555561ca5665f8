#include "tandem/train/metrics.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::train {

std::string to_json_line(const EpochMetrics& m) {
  nlohmann::ordered_json line = {{"epoch", m.epoch}, {"loss", m.loss}};
  // An epoch with nothing evaluated has no accuracy; 0 correct of 0 would read as one.
  if (m.total > 0) {
    line["accuracy"] = m.accuracy;
    line["correct"] = m.correct;
    line["total"] = m.total;
  }
  line["lr"] = m.lr;
  line["samples_per_second"] = m.samples_per_second;
  line["train_seconds"] = m.train_seconds;
  line["step"] = m.step;
  return line.dump();
}

std::string to_json_line(const StepMetrics& m) {
  nlohmann::ordered_json line = {
      {"step", m.step},
      {"epoch", m.epoch},
      {"batch", m.batch},
      {"loss", m.loss},
      {"lr", m.lr},
      {"loss_scale", m.loss_scale},
      {"optimizer_stepped", m.optimizer_stepped},
      {"seconds", m.seconds},
      {"samples_per_second", m.samples_per_second},
      {"samples", m.samples},
      {"world_size", m.world_size},
      {"time", m.time},
      {"rank_seconds", m.rank_seconds},
  };
  return line.dump();
}

JsonLinesFile::JsonLinesFile(std::string path, const std::string& key, int64_t first_dropped) : path_(std::move(path)) {
  if (std::ifstream existing{path_}) {
    std::string kept;
    for (std::string line; std::getline(existing, line);) {
      const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object() && parsed.value(key, first_dropped) < first_dropped) kept += line + "\n";
    }
    existing.close();
    write_file_atomically(path_, kept);
  }
  file_ = open_for_appending(path_);
}

JsonLinesFile::~JsonLinesFile() {
  if (file_) std::fclose(file_);
}

void JsonLinesFile::append(const std::string& json_line) {
  const std::string line = json_line + "\n";
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }
}

}  // namespace tandem::train
