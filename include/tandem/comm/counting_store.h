#pragma once
// A c10d store that passes every call to another and counts it: operations, writes, and the bytes of keys and
// values each way. It changes nothing of what the store does; it is how the control plane's traffic is measured
// (tests/comm/store_traffic_test.cpp, `tandem bench rendezvous`). Bytes are the payload (keys and values), not
// the transport's framing, so they read the same over a TCPStore, a FileStore or an in-memory store.
//
// Thread-safe as far as the store it wraps is (c10d's are): the counters are atomics.
#include <atomic>
#include <cstdint>

#include "tandem/comm/rendezvous.h"
#include "tandem/util/compat.h"

namespace tandem::comm {

// What went through a CountingStore, as of one moment.
struct StoreTraffic {
  int64_t operations = 0;
  // set, compareSet, add, deleteKey: the calls that change the store (each one grows a FileStore's file).
  int64_t writes = 0;
  int64_t bytes_sent = 0;      // keys, and the values written
  int64_t bytes_received = 0;  // the values read back

  // What went through between `earlier` and this.
  StoreTraffic since(const StoreTraffic& earlier) const;
};

class CountingStore : public compat::SharedStore {
 public:
  explicit CountingStore(StorePtr inner);

  StoreTraffic traffic() const;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current_value,
                                  const std::vector<uint8_t>& new_value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  const std::chrono::milliseconds& getTimeout() const noexcept override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;

 private:
  void count(bool write, size_t sent, size_t received);

  StorePtr inner_;
  std::atomic<int64_t> operations_{0};
  std::atomic<int64_t> writes_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace tandem::comm
