#include "tandem/train/metrics.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tandem/util/error.h"

namespace tandem::train {

std::string to_json_line(const EpochMetrics& m) {
  nlohmann::ordered_json line = {
      {"epoch", m.epoch},
      {"loss", m.loss},
      {"accuracy", m.accuracy},
      {"correct", m.correct},
      {"total", m.total},
      {"lr", m.lr},
      {"samples_per_second", m.samples_per_second},
      {"train_seconds", m.train_seconds},
      {"step", m.step},
  };
  return line.dump();
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw Error("cannot open metrics file " + path + ": " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const EpochMetrics& metrics) {
  const std::string line = to_json_line(metrics) + "\n";
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    throw Error("cannot write metrics file " + path_ + ": " + std::strerror(errno));
  }
}

}  // namespace tandem::train
