#include "checksummed_file.h"

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string_view>

#include "tandem/monitor/crc32c.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kChecksumPrefix = "crc32c.";
constexpr const char* kHeaderChecksum = "crc32c.__header__";

std::string checksum_text(uint32_t crc) { return fmt::format("{:08x}", crc); }

uint32_t checksum_of_bytes(const torch::Tensor& cpu_contiguous) {
  return monitor::crc32c(std::string_view(static_cast<const char*>(cpu_contiguous.data_ptr()), cpu_contiguous.nbytes()));
}

// Covers what the entries' own checksums do not: every entry's name, dtype and shape, and every metadata value
// (epoch, step, the schedule...), which a damaged byte could change into another valid number.
uint32_t checksum_of_header(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> layouts;
  for (const TensorEntry& entry : entries) {
    layouts[entry.name] = fmt::format("{} [{}]", c10::toString(entry.dtype), fmt::join(entry.shape, ","));
  }
  std::string text;
  for (const auto& [name, layout] : layouts) text += name + '\0' + layout + '\n';
  text += '\n';
  for (const auto& [key, value] : metadata) {
    if (key != kHeaderChecksum) text += key + '\0' + value + '\n';
  }
  return monitor::crc32c(text);
}

}  // namespace

std::vector<TensorEntry> entries_of(const NamedTensors& tensors) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, tensor] : tensors) entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  return entries;
}

void save_checksummed(const std::string& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  // On the CPU and contiguous as the file holds them, so that the checksums are of the bytes written.
  NamedTensors host;
  for (const auto& [name, tensor] : tensors) host.emplace_back(name, tensor.detach().to(torch::kCPU).contiguous());
  for (const auto& [name, tensor] : host) metadata[kChecksumPrefix + name] = checksum_text(checksum_of_bytes(tensor));
  metadata[kHeaderChecksum] = checksum_text(checksum_of_header(entries_of(host), metadata));
  save_safetensors(path, host, metadata);
}

std::string header_damage(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata,
                          const std::string& path) {
  auto found = metadata.find(kHeaderChecksum);
  if (found != metadata.end() && found->second == checksum_text(checksum_of_header(entries, metadata))) return "";
  return fmt::format("{}: its metadata (or an entry's name, dtype or shape) does not match its checksum (the file is "
                     "damaged)",
                     path);
}

std::string entry_damage(const std::string& name, const torch::Tensor& bytes,
                         const std::map<std::string, std::string>& metadata, const std::string& path) {
  auto found = metadata.find(kChecksumPrefix + name);
  if (found != metadata.end() && found->second == checksum_text(checksum_of_bytes(bytes.contiguous()))) return "";
  return fmt::format("{}: entry '{}' does not match its checksum (the file is damaged)", path, name);
}

}  // namespace tandem::checkpoint
