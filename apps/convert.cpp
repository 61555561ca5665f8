// `tandem convert`: a tandem checkpoint or weights file (or anything else --init reads) into PyTorch's distributed
// checkpoint or Hugging Face's sharded safetensors, for PyTorch to continue from.
#include <fmt/format.h>

#include <cctype>

#include "apps/command.h"
#include "apps/flag_checks.h"
#include "tandem/checkpoint/checkpoint_conversion.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::app {
namespace {

// "5GB", "500MB", "64KiB", "1000000": decimal units as Hugging Face's writers take them, binary ones with "i".
uint64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15) throw InvalidArgument("not a size in bytes: " + text);
  const uint64_t number = std::stoull(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000'000}, {"GB", 1000'000'000}, {"KiB", 1ull << 10},
      {"MiB", 1ull << 20}, {"GiB", 1ull << 30}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && number > 0 && number <= UINT64_MAX / scale) return number * scale;
  }
  throw InvalidArgument("not a size in bytes: " + text);
}

struct ConvertFlags {
  std::string source;
  std::string destination;
  std::string format;
  std::string max_shard_size = "5GB";
};

const CommandRegistration kRegisterConvert{
    "convert",
    "Write a checkpoint or weights in PyTorch's formats: a distributed checkpoint (DCP) or sharded safetensors",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<ConvertFlags>();
      command.add_option("source", flags->source,
                         "what to convert: weights (--save-weights), a tandem checkpoint, full or sharded, sharded "
                         "safetensors or a DCP folder")
          ->required()
          ->check(CLI::ExistingPath);
      command.add_option("destination", flags->destination, "the folder to write; it must not exist")->required();
      command.add_option("--format", flags->format,
                         "dcp (PyTorch's distributed checkpoint: .metadata and __<rank>_0.distcp, the model under "
                         "model. as torchtitan saves it; a sharded tandem checkpoint gives one .distcp per rank file, "
                         "written without gathering the model) or safetensors (model-0000i-of-0000n.safetensors and "
                         "model.safetensors.index.json, as Hugging Face publishes models)")
          ->required()
          ->check(CLI::IsMember({"dcp", "safetensors"}));
      command.add_option("--max-shard-size", flags->max_shard_size,
                         "--format safetensors: the largest file, in bytes or with a unit (500MB, 5GB, 2GiB); a larger "
                         "tensor gets a file of its own")
          ->capture_default_str()
          ->check(parsed_by(parse_byte_size, "a size such as 500MB, 5GB or 2GiB"));
      return [flags] {
        const checkpoint::ConversionReport report = checkpoint::convert_checkpoint(
            flags->source, flags->destination, checkpoint::parse_conversion_format(flags->format),
            parse_byte_size(flags->max_shard_size));
        log::info("wrote {} tensors ({:.1f} MB) in {} file(s) to {}", report.tensors, report.bytes / 1e6,
                  report.files, flags->destination);
        return 0;
      };
    }};

}  // namespace
}  // namespace tandem::app
