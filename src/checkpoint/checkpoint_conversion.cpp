// Conversions to PyTorch's formats (tandem/checkpoint/checkpoint_conversion.h).
#include "tandem/checkpoint/checkpoint_conversion.h"


#include <filesystem>

#include "checkpoint_file.h"
#include "file_damage.h"
#include "folder_output.h"
#include "optimizer_export.h"
#include "sharded_checkpoint_reader.h"
#include "tensor_boxes.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kConvertedModelPrefix = "model.";

// Each tensor as the one box that covers it, under `prefix` + its name.
void whole_tensors_as_boxes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            std::vector<TensorBoxData>& boxes, const std::string& prefix = "") {
  for (const auto& [name, tensor] : tensors) {
    boxes.push_back({prefix + name, tensor.sizes().vec(), std::vector<int64_t>(tensor.dim(), 0), tensor});
  }
}

uint64_t bytes_of(const torch::Tensor& tensor) { return static_cast<uint64_t>(tensor.numel()) * tensor.element_size(); }

// A sharded tandem checkpoint, one rank file at a time: each piece of a parameter cut into the boxes DCP describes.
// The checkpoint file's own model tensors (buffers) join rank 0's file.
ConversionReport convert_sharded_to_dcp(const std::string& source, const TensorFile& checkpoint,
                                        DistributedCheckpointWriter& writer) {
  ShardedCheckpointReader pieces(source, checkpoint.metadata);
  const ShardedIndex& index = pieces.index();
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters;
  for (const ShardedTensor& tensor : index.tensors) {
    if (!is_optimizer_state_name(tensor.name)) parameters.emplace_back(tensor.name, tensor.shape);
  }
  // The archive of a sharded checkpoint holds the scalars only (the step); the rank files hold the rest.
  const ExportedOptimizer optimizer = export_optimizer_state(checkpoint, source, parameters);
  ConversionReport report;
  for (size_t rank = 0; rank < index.files.size(); ++rank) {
    std::vector<TensorBoxData> boxes;
    if (rank == 0) {
      whole_tensors_as_boxes(stored_model_tensors(checkpoint).tensors, boxes, kConvertedModelPrefix);
    }
    for (const ShardedTensor& tensor : index.tensors) {
      const std::string name = is_optimizer_state_name(tensor.name) ? tensor.name : kConvertedModelPrefix + tensor.name;
      for (const ShardPiece& piece : tensor.pieces) {
        if (piece.file != index.files[rank]) continue;
        const torch::Tensor flat = pieces.read_range(tensor.name, piece.tensor_begin, piece.tensor_end);
        int64_t at = 0;
        for (const TensorBox& box : boxes_of_range(tensor.shape, piece.tensor_begin, piece.tensor_end)) {
          const int64_t count = c10::multiply_integers(box.sizes);
          boxes.push_back({name, tensor.shape, box.offsets, flat.narrow(0, at, count).view(box.sizes)});
          at += count;
        }
      }
    }
    std::vector<ByteEntry> param_group;
    if (rank == 0) {
      whole_tensors_as_boxes(optimizer.tensors, boxes);
      param_group = optimizer.param_group;
    }
    for (const TensorBoxData& box : boxes) report.bytes += bytes_of(box.data);
    writer.write_file(static_cast<int>(rank), boxes, param_group);
    ++report.files;
  }
  report.tensors = static_cast<int64_t>(parameters.size() + stored_model_tensors(checkpoint).tensors.size());
  return report;
}

// A full tandem checkpoint: its model and its optimizer's state, whole, in one file.
ConversionReport convert_full_to_dcp(const std::string& source, const TensorFile& checkpoint,
                                     const std::string& destination) {
  const TensorFile model = stored_model_tensors(checkpoint);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, tensor] : model.tensors) shapes.emplace_back(name, tensor.sizes().vec());
  const ExportedOptimizer optimizer = export_optimizer_state(checkpoint, source, shapes);
  std::vector<TensorBoxData> boxes;
  whole_tensors_as_boxes(model.tensors, boxes, kConvertedModelPrefix);
  whole_tensors_as_boxes(optimizer.tensors, boxes);
  ConversionReport report;
  report.tensors = static_cast<int64_t>(model.tensors.size());
  for (const TensorBoxData& box : boxes) report.bytes += bytes_of(box.data);
  DistributedCheckpointWriter writer(destination);
  writer.write_file(0, boxes, optimizer.param_group);
  writer.finish();
  report.files = 1;
  return report;
}

}  // namespace

ConversionFormat parse_conversion_format(const std::string& name) {
  if (name == "dcp") return ConversionFormat::kDistributedCheckpoint;
  if (name == "safetensors") return ConversionFormat::kShardedSafetensors;
  throw InvalidArgument("conversion format '" + name + "' is not one of dcp, safetensors");
}

ConversionReport convert_checkpoint(const std::string& source, const std::string& destination,
                                    ConversionFormat format, uint64_t max_shard_bytes) {
  FolderOutput::require_absent(destination);
  std::error_code error;
  if (format == ConversionFormat::kDistributedCheckpoint && std::filesystem::is_regular_file(source, error)) {
    const TensorFile file = load_safetensors(source);
    const StoredFormat stored = stored_format(file.metadata);
    if (stored != StoredFormat::kWeights) {
      const std::string damage = file_damage(file, source, /*parts=*/true);
      if (!damage.empty()) throw InvalidArgument(damage + "; convert an intact checkpoint");
    }
    if (stored == StoredFormat::kSharded) {
      DistributedCheckpointWriter writer(destination);
      const ConversionReport report = convert_sharded_to_dcp(source, file, writer);
      writer.finish();
      return report;
    }
    if (stored != StoredFormat::kWeights) return convert_full_to_dcp(source, file, destination);
  }
  const TensorFile weights = read_model_weights(source);
  ConversionReport report;
  report.tensors = static_cast<int64_t>(weights.tensors.size());
  for (const auto& [name, tensor] : weights.tensors) report.bytes += bytes_of(tensor);
  if (format == ConversionFormat::kShardedSafetensors) {
    report.files = static_cast<int64_t>(write_sharded_safetensors(destination, weights.tensors, max_shard_bytes));
    return report;
  }
  DistributedCheckpointWriter writer(destination);
  std::vector<TensorBoxData> boxes;
  whole_tensors_as_boxes(weights.tensors, boxes, kConvertedModelPrefix);
  writer.write_file(0, boxes);
  writer.finish();
  report.files = 1;
  return report;
}

}  // namespace tandem::checkpoint
