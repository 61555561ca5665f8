#pragma once
// The zip container of PyTorch's `torch.save` archives, as PyTorch writes it: every entry stored, uncompressed,
// its data aligned to 64 bytes by padding in the local header's extra field. Internal to checkpoint/.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::checkpoint {

struct StoredZipEntry {
  std::string name;
  std::string_view data;  // inside the bytes given to read_stored_zip
};

// The entries of a zip held in `bytes`, each checked against its CRC-32. Throws InvalidArgument, beginning with
// `source`, for anything else: a cut-short archive, compressed entries, a size or offset outside the bytes, a
// checksum that does not match, zip64.
std::vector<StoredZipEntry> read_stored_zip(std::string_view bytes, const std::string& source);

// Writes a zip of the named records, in order, each stored and aligned to 64 bytes, through `append` (the records'
// data go to it as they are, uncopied); returns its size. Records must stay under 4 GiB.
uint64_t write_stored_zip(const std::vector<std::pair<std::string, std::string_view>>& records,
                          const std::function<void(std::string_view)>& append);

}  // namespace tandem::checkpoint
