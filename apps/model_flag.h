#pragma once
// The --model flag of every command: the names of the registered models (nn/model_registry.h), and the check
// that refuses any other name with the list.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tandem/nn/model_registry.h"

namespace tandem::app {

inline std::vector<std::string> registered_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, description] : nn::registered_models()) names.push_back(name);
  return names;
}

inline CLI::Validator registered_model() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        const std::vector<std::string> names = registered_model_names();
        if (std::find(names.begin(), names.end(), name) != names.end()) return {};
        return fmt::format("unknown model '{}'; the models are {}", name, fmt::join(names, ", "));
      },
      "");
}

}  // namespace tandem::app
