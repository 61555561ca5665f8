#pragma once
// The benchmarks' own kinds of value, checked as `tandem bench`'s command line is read, beside flag_checks.h's
// ranges: sizes in bytes that must fit in this host's memory, and lists of world sizes. CLI11 writes the flag's
// name in front of the text a check returns.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/allreduce/allreduce_bench.h"
#include "bench/harness/host.h"
#include "bench/harness/world_sizes.h"
#include "tandem/util/error.h"

namespace tandem::app {

// Bounds of the flags whose type allows far more than a benchmark can use.
// DDP bucket caps in MiB: about 1 KB already puts every tensor but the smallest (biases) in a bucket of its own,
// and 1 TiB, the library's cap for one bucket, holds any model.
inline constexpr double kBenchSmallestBucketMb = 0.001;
inline constexpr double kBenchLargestBucketMb = 1024.0 * 1024.0;

// "" when `buffers` buffers of `bytes` each fit in this host's memory, else why not.
inline std::string bench_buffers_fit(int64_t bytes, int buffers, const char* what) {
  const int64_t memory = bench::host_memory_bytes();
  if (bytes <= memory / buffers) return {};
  return fmt::format("{} {} more than this host's memory ({:.1f}G); give a smaller size", bench::format_size(bytes),
                     what, static_cast<double>(memory) / (int64_t{1} << 30));
}

// --sizes: bench::parse_sizes()'s grammar, the largest size fitting in memory.
inline CLI::Validator bench_allreduce_sizes() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::vector<int64_t> sizes;
        try {
          sizes = bench::parse_sizes(text);
        } catch (const InvalidArgument& error) {
          return error.what();
        }
        return bench_buffers_fit(*std::max_element(sizes.begin(), sizes.end()), 1, "is");
      },
      "");
}

// --memcpy-size: one size; the copy's source and target both fit in memory.
inline CLI::Validator bench_memcpy_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          return bench_buffers_fit(bench::parse_size(text), 2, "twice (the copy's source and target) is");
        } catch (const InvalidArgument& error) {
          return error.what();
        }
      },
      "");
}

// A flag whose own parser says what is wrong: its message is the refusal.
template <typename Parse>
CLI::Validator refused_by_parser(Parse parse) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const Error& error) {
          return error.what();
        }
      },
      "");
}

inline CLI::Validator bench_world_sizes() {
  return refused_by_parser([](const std::string& text) { bench::parse_world_sizes(text); });
}

}  // namespace tandem::app
