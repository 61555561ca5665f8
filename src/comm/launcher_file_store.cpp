#include "tandem/comm/launcher_file_store.h"

#include <c10/util/intrusive_ptr.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// The errors of a write that found no room: a full file system, a full quota, a file size limit.
bool is_out_of_room(const std::system_error& error) {
  const int code = error.code().value();
  return code == ENOSPC || code == EDQUOT || code == EFBIG;
}

class LauncherFileStore : public compat::SharedStore {
 public:
  LauncherFileStore(const std::string& path, int world_size, std::chrono::milliseconds timeout)
      : tmpdir_(std::filesystem::path(path).parent_path().parent_path().string()) {
    // FileStore's constructor writes to the file too (its count of the processes that opened it).
    inner_ = writing([&] { return c10::make_intrusive<c10d::FileStore>(path, world_size); });
    inner_->setTimeout(timeout);
    // FileStore's destructor appends to the file and throws where there is no room, and a throwing destructor is
    // std::terminate; so this process keeps a reference of its own that nothing releases. The file goes with the
    // launcher's folder.
    c10::raw::intrusive_ptr::incref(inner_.get());
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    writing([&] { inner_->set(key, value); });
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current_value,
                                  const std::vector<uint8_t>& new_value) override {
    return writing([&] { return inner_->compareSet(key, current_value, new_value); });
  }
  int64_t add(const std::string& key, int64_t value) override {
    return writing([&] { return inner_->add(key, value); });
  }
  bool deleteKey(const std::string& key) override {
    return writing([&] { return inner_->deleteKey(key); });
  }
  std::vector<uint8_t> get(const std::string& key) override { return inner_->get(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override { return inner_->getTimeout(); }
  void setTimeout(const std::chrono::milliseconds& timeout) override { inner_->setTimeout(timeout); }

 private:
  // Runs a call that appends to the store's file.
  template <typename Call>
  auto writing(Call&& call) -> decltype(call()) {
    try {
      return call();
    } catch (const std::system_error& error) {
      if (!is_out_of_room(error)) throw;
      throw CommError(fmt::format("{} (TMPDIR) is full: tandem run's workers keep their rendezvous store there, and "
                                  "it could not grow ({}); free space in {}, or point TMPDIR at a folder with room",
                                  tmpdir_, std::strerror(error.code().value()), tmpdir_));
    }
  }

  std::string tmpdir_;
  c10::intrusive_ptr<c10d::FileStore> inner_;
};

}  // namespace

StorePtr open_launcher_file_store(const std::string& path, int world_size, std::chrono::milliseconds timeout) {
  try {
    return c10::make_intrusive<LauncherFileStore>(path, world_size, timeout);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& error) {
    throw CommError(fmt::format("cannot open the rendezvous file '{}' that tandem run made: {}", path, error.what()));
  }
}

}  // namespace tandem::comm
