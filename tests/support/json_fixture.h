#pragma once
// The JSON fixtures PyTorch made (tests/fixtures/make_*.py): what tandem must equal, value for value.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace tandem::testing {

// tests/fixtures/NAME, parsed; a missing file fails the test that asked for it.
inline nlohmann::json load_json_fixture(const std::string& name) {
  const std::string path = std::string(TANDEM_FIXTURE_DIR) + "/" + name;
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "missing fixture " << path;
  return nlohmann::json::parse(file);
}

}  // namespace tandem::testing
