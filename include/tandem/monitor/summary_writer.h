#pragma once
// Writes TensorBoard scalars: one events file (a TFRecord file of Event protocol buffers, record_writer.h) per
// writer, in the directory TensorBoard is pointed at. The first event names the file version; each add_*
// appends one event and flushes it, so TensorBoard shows a running job live and a killed one keeps every
// value it added. Not thread-safe: one thread owns a writer.
//
// A resumed run trains some steps again. It opens a new writer in the same directory and calls
// add_session_start(S) before any scalar: TensorBoard's reader then drops the earlier files' events at step S
// and after, so each step shows the values of the run that finished it. The reader takes a directory's files
// in the order of their names, which is the order of their creation (see the constructor).
#include <cstdint>
#include <string>

#include "tandem/monitor/record_writer.h"

namespace tandem::monitor {

class SummaryWriter {
 public:
  // Creates log_dir if missing, and in it events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n> (n makes
  // the name unique in this process; pid and n zero-padded, so that names sort in creation order also within
  // one second); writes the file_version event "brain.Event:2". Throws Error naming the directory or the
  // file if either cannot be created, is a symbolic link, or cannot be written.
  explicit SummaryWriter(const std::string& log_dir);

  // A scalar `tag` at x = `step`, stored as float32 as TensorBoard does; wall time now unless given (seconds
  // since the Unix epoch).
  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time_seconds);
  // A SessionLog START at `step`: TensorBoard's reader then drops the events of this directory's earlier files
  // with step >= `step` (a resumed run trains those steps again).
  void add_session_start(int64_t step);
  void flush();

  const std::string& path() const { return records_.path(); }

 private:
  // Appends Event{wall_time, step, <what_field>: what} and flushes it.
  void write_event(double wall_time_seconds, int64_t step, int what_field, const std::string& what);

  RecordWriter records_;
};

}  // namespace tandem::monitor
