#pragma once
// Logging that always says who is speaking. Each line goes to stderr as "[tandem rank r/N] message" from a rank
// (a process or test thread that joined a process group), and as "tandem: message" from a process that is no
// rank: the launcher, `tandem report`, `tandem export-images`. info() lines print on every rank, main_info()
// only on rank 0 (and in a process that is no rank).
#include <fmt/format.h>

#include <string>

namespace tandem::log {

// The rank and world size that log lines and error messages name. init_process_group sets it for the
// process; tests that run ranks as threads set it per thread.
void set_identity(int rank, int world_size);
// Without an identity, a process counts as rank 0 of 1.
int identity_rank();
int identity_world_size();

// "[tandem rank r/N] " for a rank, "tandem: " for a process that is none.
std::string line_prefix();

void write(const std::string& level, const std::string& message);

template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  write("", fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write("warning: ", fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void main_info(fmt::format_string<Args...> format, Args&&... args) {
  if (identity_rank() == 0) write("", fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tandem::log
