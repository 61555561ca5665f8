#include "tandem/monitor/summary_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <system_error>

#include "tandem/monitor/protobuf_encoder.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

// Field numbers of TensorBoard's tensorboard/compat/proto/event.proto and summary.proto.
constexpr int kEventWallTime = 1;        // double
constexpr int kEventStep = 2;            // int64
constexpr int kEventFileVersion = 3;     // string, oneof what
constexpr int kEventSummary = 5;         // Summary, oneof what
constexpr int kEventSessionLog = 7;      // SessionLog, oneof what
constexpr int kSummaryValue = 1;         // repeated Summary.Value
constexpr int kValueTag = 1;             // string
constexpr int kValueSimpleValue = 2;     // float, oneof value
constexpr int kSessionLogStatus = 1;     // SessionLog.SessionStatus
constexpr int64_t kSessionStart = 1;     // SessionStatus START

// Version 2 makes TensorBoard's reader purge on a SessionLog START rather than on any step that goes back.
constexpr const char* kFileVersion = "brain.Event:2";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The name TensorFlow's writers give, so tools that look for events files by name find ours.
std::string new_event_file_path(const std::string& log_dir) {
  static std::atomic<int> writers_created{0};
  std::error_code error;
  std::filesystem::create_directories(log_dir, error);
  if (error) throw Error("cannot create TensorBoard log dir " + log_dir + ": " + error.message());
  const auto unix_seconds = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::system_clock::now().time_since_epoch());
  return fmt::format("{}/events.out.tfevents.{}.{}.{:010}.{:06}", log_dir, unix_seconds.count(), host_name(),
                     ::getpid(), writers_created++);
}

}  // namespace

SummaryWriter::SummaryWriter(const std::string& log_dir) : records_(new_event_file_path(log_dir)) {
  write_event(now_seconds(), 0, kEventFileVersion, kFileVersion);
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalar(tag, value, step, now_seconds());
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time_seconds) {
  ProtobufEncoder scalar;
  scalar.add_bytes(kValueTag, tag);
  scalar.add_float(kValueSimpleValue, static_cast<float>(value));
  ProtobufEncoder summary;
  summary.add_bytes(kSummaryValue, scalar.bytes());
  write_event(wall_time_seconds, step, kEventSummary, summary.bytes());
}

void SummaryWriter::add_session_start(int64_t step) {
  ProtobufEncoder session_log;
  session_log.add_int64(kSessionLogStatus, kSessionStart);
  write_event(now_seconds(), step, kEventSessionLog, session_log.bytes());
}

void SummaryWriter::flush() { records_.flush(); }

void SummaryWriter::write_event(double wall_time_seconds, int64_t step, int what_field, const std::string& what) {
  ProtobufEncoder event;
  event.add_double(kEventWallTime, wall_time_seconds);
  event.add_int64(kEventStep, step);
  event.add_bytes(what_field, what);
  records_.write(event.bytes());
  records_.flush();
}

}  // namespace tandem::monitor
