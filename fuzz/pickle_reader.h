#pragma once
// What the pickle_reader fuzzer and its regression test feed each input to: PyTorch's checkpoint pickles as tandem
// reads them, a distributed checkpoint's `.metadata` (the bounded pickle reader with DCP's classes) and one item of
// a `.distcp` file (the stored zip, then the tensor's or the value's pickle). Each either reads or throws
// InvalidArgument.
#include <cstring>
#include <string_view>

#include "src/checkpoint/dcp_metadata.h"
#include "src/checkpoint/torch_archive.h"
#include "tandem/util/error.h"

namespace tandem::fuzz {

inline void read_pytorch_pickles(std::string_view bytes) {
  const auto refused = [](auto&& read) {
    try {
      read();
    } catch (const InvalidArgument&) {
    }
  };
  refused([&] { checkpoint::parse_dcp_metadata(bytes, "input"); });
  refused([&] {
    torch::Tensor raw = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    if (!bytes.empty()) std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
    checkpoint::read_torch_archive_tensor(raw, "input");
  });
  refused([&] { checkpoint::read_torch_archive_value(bytes, "input"); });
}

}  // namespace tandem::fuzz
