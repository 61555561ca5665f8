#include "tandem/train/metrics.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
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

MetricsWriter::MetricsWriter(const std::string& path, int first_epoch) : path_(path) {
  if (std::ifstream existing{path}) {
    std::string kept;
    for (std::string line; std::getline(existing, line);) {
      const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object() && parsed.value("epoch", first_epoch) < first_epoch) kept += line + "\n";
    }
    const std::string temp = path + ".tmp";
    std::ofstream rewritten(temp, std::ios::trunc);
    rewritten << kept;
    rewritten.close();
    if (!rewritten || std::rename(temp.c_str(), path.c_str()) != 0) {
      throw Error("cannot rewrite metrics file " + path + ": " + std::strerror(errno));
    }
  }
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
