#include "tandem/comm/counting_store.h"

namespace tandem::comm {
namespace {

// add() and getNumKeys() carry a 64-bit number.
constexpr size_t kNumberBytes = sizeof(int64_t);

size_t key_bytes(const std::vector<std::string>& keys) {
  size_t bytes = 0;
  for (const std::string& key : keys) bytes += key.size();
  return bytes;
}

}  // namespace

StoreTraffic StoreTraffic::since(const StoreTraffic& earlier) const {
  return {operations - earlier.operations, writes - earlier.writes, bytes_sent - earlier.bytes_sent,
          bytes_received - earlier.bytes_received};
}

CountingStore::CountingStore(StorePtr inner) : inner_(std::move(inner)) {}

StoreTraffic CountingStore::traffic() const {
  return {operations_.load(), writes_.load(), bytes_sent_.load(), bytes_received_.load()};
}

void CountingStore::count(bool write, size_t sent, size_t received) {
  operations_.fetch_add(1);
  if (write) writes_.fetch_add(1);
  bytes_sent_.fetch_add(static_cast<int64_t>(sent));
  bytes_received_.fetch_add(static_cast<int64_t>(received));
}

void CountingStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  count(true, key.size() + value.size(), 0);
  inner_->set(key, value);
}

std::vector<uint8_t> CountingStore::compareSet(const std::string& key, const std::vector<uint8_t>& current_value,
                                               const std::vector<uint8_t>& new_value) {
  std::vector<uint8_t> stored = inner_->compareSet(key, current_value, new_value);
  count(true, key.size() + current_value.size() + new_value.size(), stored.size());
  return stored;
}

std::vector<uint8_t> CountingStore::get(const std::string& key) {
  std::vector<uint8_t> value = inner_->get(key);
  count(false, key.size(), value.size());
  return value;
}

int64_t CountingStore::add(const std::string& key, int64_t value) {
  // add(key, 0) only reads the counter, but it is still a write to c10d: a FileStore appends it to its file.
  count(true, key.size() + kNumberBytes, kNumberBytes);
  return inner_->add(key, value);
}

bool CountingStore::deleteKey(const std::string& key) {
  count(true, key.size(), 0);
  return inner_->deleteKey(key);
}

bool CountingStore::check(const std::vector<std::string>& keys) {
  count(false, key_bytes(keys), 0);
  return inner_->check(keys);
}

int64_t CountingStore::getNumKeys() {
  count(false, 0, kNumberBytes);
  return inner_->getNumKeys();
}

void CountingStore::wait(const std::vector<std::string>& keys) {
  count(false, key_bytes(keys), 0);
  inner_->wait(keys);
}

void CountingStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  count(false, key_bytes(keys), 0);
  inner_->wait(keys, timeout);
}

const std::chrono::milliseconds& CountingStore::getTimeout() const noexcept { return inner_->getTimeout(); }

void CountingStore::setTimeout(const std::chrono::milliseconds& timeout) { inner_->setTimeout(timeout); }

}  // namespace tandem::comm
