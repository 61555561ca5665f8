// PyTorch's checkpoint formats as tandem reads and writes them: the bounded pickle reader (a forged pickle is
// refused, never run), tensor boxes against tandem's flat pieces, distributed checkpoints (DCP) and sharded
// safetensors written and read back on other cuts, and every kind of damage as one line. PyTorch's own side is
// tests/apps/pytorch_checkpoints_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/nn/modules/linear.h>

#include "src/checkpoint/dcp_metadata.h"
#include "src/checkpoint/pickle.h"
#include "src/checkpoint/stored_zip.h"
#include "src/checkpoint/torch_archive.h"
#include "src/checkpoint/tensor_boxes.h"
#include "support/scratch_dir.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/sharded_safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "(no error)";
}

void overwrite_with(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Python's own `pickle.dumps` of an object whose unpickling calls os.system("touch /tmp/pwned"): protocol 2, GLOBAL
// 'os system', the argument tuple, REDUCE.
const std::string kForgedPickle = std::string("\x80\x02" "cos\nsystem\nq\x00X\x10\x00\x00\x00touch /tmp/pwned") +
                                  "q\x01\x85q\x02Rq\x03.";

TEST(PickleReader, AForgedPickleThatWouldRunACommandIsRefusedNamingWhatItCalls) {
  const std::string message = message_of([] { read_pickle(kForgedPickle, {"torch.Size"}, "forged.pkl"); });
  EXPECT_NE(message.find("forged.pkl"), std::string::npos) << message;
  EXPECT_NE(message.find("`os.system`"), std::string::npos) << message;
  EXPECT_NE(message.find("refused, never run"), std::string::npos) << message;
}

TEST(PickleReader, ReadsBackWhatTheWriterWrote) {
  PickleWriter pickle;
  pickle.empty_dict();
  pickle.mark();
  pickle.string("lr");
  pickle.real(0.001);
  pickle.string("betas");
  pickle.real(0.9);
  pickle.real(0.999);
  pickle.tuple(2);
  pickle.string("steps");
  pickle.integer(-5000000000);
  pickle.string("size");
  pickle.global("torch", "Size");
  pickle.mark();
  pickle.integer(128);
  pickle.integer(300);
  pickle.tuple_from_mark();
  pickle.tuple(1);
  pickle.reduce();
  pickle.setitems_from_mark();
  const PickleDocument document = read_pickle(pickle.finish(), {"torch.Size"}, "test");
  const PickleValue& root = document.root();
  ASSERT_TRUE(root.is(PickleValue::Kind::kDict));
  EXPECT_DOUBLE_EQ(root.get("lr")->real, 0.001);
  ASSERT_EQ(root.get("betas")->items.size(), 2u);
  EXPECT_DOUBLE_EQ(root.get("betas")->items[1]->real, 0.999);
  EXPECT_EQ(root.get("steps")->integer, -5000000000);
  const PickleValue* size = root.get("size");
  ASSERT_TRUE(size->is(PickleValue::Kind::kObject));
  EXPECT_EQ(size->text, "torch.Size");
  EXPECT_EQ(size->items[0]->items[1]->integer, 300);
}

TEST(PickleReader, CutShortOrUnknownOpcodesAreOneLineEach) {
  PickleWriter pickle;
  pickle.string("a string");
  const std::string whole = pickle.finish();
  EXPECT_NE(message_of([&] { read_pickle(whole.substr(0, whole.size() - 4), {}, "x"); }).find("cut short"),
            std::string::npos);
  EXPECT_NE(message_of([] { read_pickle(std::string("\x80\x02" "i__builtin__\nobject\n."), {}, "x"); })
                .find("opcode 0x69"),
            std::string::npos);
  EXPECT_NE(message_of([] { read_pickle("\x80\x02h\x07.", {}, "x"); }).find("memo entry 7"), std::string::npos);
}

// Every flat range of a [4, 5, 3] tensor is tiled by its boxes, in order, and with at most 2 per dimension beyond
// the first plus one.
TEST(TensorBoxes, EveryFlatRangeIsTiledByItsBoxesInRowMajorOrder) {
  const std::vector<int64_t> shape = {4, 5, 3};
  const torch::Tensor whole = torch::arange(60).view(shape);
  for (int64_t begin = 0; begin < 60; ++begin) {
    for (int64_t end = begin + 1; end <= 60; ++end) {
      const std::vector<TensorBox> boxes = boxes_of_range(shape, begin, end);
      ASSERT_LE(boxes.size(), 5u);
      std::vector<torch::Tensor> parts;
      for (const TensorBox& box : boxes) {
        torch::Tensor part = whole;
        for (size_t d = 0; d < shape.size(); ++d) part = part.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
        parts.push_back(part.reshape({-1}));
      }
      ASSERT_TRUE(torch::equal(torch::cat(parts), torch::arange(begin, end))) << begin << ".." << end;
    }
  }
}

// A model's tensors cut as fsdp cuts them for 3 ranks (flat ranges across tensor ends), written as DCP and read back.
TEST(DistributedCheckpoint, WrittenFromFlatPiecesOfThreeRanksReadsBackWhole) {
  const std::string dir = testing::make_temp_dir("dcp_round_trip") + "/ckpt";
  torch::manual_seed(0);
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"model.fc.weight", torch::randn({7, 5})}, {"model.fc.bias", torch::randn({7})},
      {"model.scale", torch::randn({}).to(torch::kBFloat16)}};
  DistributedCheckpointWriter writer(dir);
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<TensorBoxData> boxes;
    for (const auto& [name, tensor] : tensors) {
      const int64_t numel = tensor.numel();
      const int64_t begin = numel * rank / 3, end = numel * (rank + 1) / 3;
      if (tensor.dim() == 0) {
        if (rank == 0) boxes.push_back({name, {}, {}, tensor});
        continue;
      }
      int64_t at = begin;
      for (const TensorBox& box : boxes_of_range(tensor.sizes().vec(), begin, end)) {
        const int64_t count = c10::multiply_integers(box.sizes);
        boxes.push_back({name, tensor.sizes().vec(), box.offsets, tensor.reshape({-1}).narrow(0, at, count).view(box.sizes)});
        at += count;
      }
    }
    writer.write_file(rank, boxes);
  }
  EXPECT_FALSE(fs::exists(dir)) << "the folder appears only when finished";
  writer.finish();
  EXPECT_TRUE(is_distributed_checkpoint(dir));
  const TensorFile file = read_distributed_checkpoint(dir);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_TRUE(file.find(name).defined()) << name;
    EXPECT_TRUE(torch::equal(file.find(name), tensor)) << name;
  }
  EXPECT_NE(message_of([&] { DistributedCheckpointWriter again(dir); }).find("exists already"), std::string::npos);
}

// A piece of 4 GiB or more would need zip64: refused in one line before its file is begun (the tensor is allocated,
// never touched, so it takes no memory).
TEST(DistributedCheckpoint, APieceOfFourGibibytesIsRefusedBeforeItsFileIsBegun) {
  const std::string dir = testing::make_temp_dir("dcp_huge_piece") + "/ckpt";
  const int64_t numel = int64_t{1} << 32;
  const std::string message = message_of([&] {
    DistributedCheckpointWriter writer(dir);
    writer.write_file(0, {{"huge", {numel}, {0}, torch::empty({numel}, torch::kUInt8)}});
  });
  EXPECT_NE(message.find("a piece of 'huge' holds 4.29 GB"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir));
}

// A forged archive whose view is larger than its storage (size 2^40, stride 0 over one float) would have the reader
// allocate 4 TB: refused by its sizes first.
TEST(TorchArchive, AViewLargerThanItsStorageIsRefusedBeforeAnythingIsAllocated) {
  PickleWriter pickle;
  pickle.global("torch._utils", "_rebuild_tensor_v2");
  pickle.mark();
  pickle.mark();
  pickle.string("storage");
  pickle.global("torch", "FloatStorage");
  pickle.string("0");
  pickle.string("cpu");
  pickle.integer(1);
  pickle.tuple_from_mark();
  pickle.persistent_id();
  pickle.integer(0);
  pickle.integer(int64_t{1} << 40);
  pickle.tuple(1);
  pickle.integer(0);
  pickle.tuple(1);
  pickle.tuple_from_mark();
  pickle.reduce();
  const std::string data = pickle.finish();
  std::string archive;
  write_stored_zip({{"archive/data.pkl", data}, {"archive/data/0", std::string_view("\0\0\x80?", 4)}},
                   [&](std::string_view bytes) { archive += bytes; });
  torch::Tensor raw = torch::empty({static_cast<int64_t>(archive.size())}, torch::kUInt8);
  std::memcpy(raw.data_ptr(), archive.data(), archive.size());
  const std::string message = message_of([&] { read_torch_archive_tensor(raw, "forged"); });
  EXPECT_NE(message.find("its size or stride exceeds its storage"), std::string::npos) << message;
}

// A forged .metadata giving a tensor a shape of 2^40 elements and no pieces: refused before the tensor is made.
TEST(DistributedCheckpoint, AShapeNoPieceHoldsIsRefusedBeforeItIsAllocated) {
  const std::string dir = testing::make_temp_dir("dcp_forged_shape") + "/ckpt";
  fs::create_directories(dir);
  DcpMetadata metadata;
  metadata.tensors["w"] = {torch::kFloat32, {int64_t{1} << 40}, {}};
  overwrite_with(dir + "/.metadata", write_dcp_metadata(metadata));
  const std::string message = message_of([&] { read_distributed_checkpoint(dir); });
  EXPECT_NE(message.find("the pieces of 'w' hold 0 elements and the tensor 1099511627776"), std::string::npos)
      << message;
}

class DistributedCheckpointDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir(std::string("dcp_damage_") +
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/ckpt";
    DistributedCheckpointWriter writer(dir_);
    writer.write_file(0, {{"w", {4, 2}, {0, 0}, torch::ones({2, 2})}});
    writer.write_file(1, {{"w", {4, 2}, {2, 0}, torch::zeros({2, 2})}});
    writer.finish();
  }
  std::string dir_;
};

TEST_F(DistributedCheckpointDamage, AMissingPieceFileIsNamed) {
  fs::remove(dir_ + "/__1_0.distcp");
  const std::string message = message_of([&] { read_distributed_checkpoint(dir_); });
  EXPECT_NE(message.find("__1_0.distcp: missing"), std::string::npos) << message;
}

TEST_F(DistributedCheckpointDamage, ACutShortPieceFileIsNamed) {
  const std::string bytes = testing::read_file(dir_ + "/__1_0.distcp");
  overwrite_with(dir_ + "/__1_0.distcp", bytes.substr(0, bytes.size() / 2));
  const std::string message = message_of([&] { read_distributed_checkpoint(dir_); });
  EXPECT_NE(message.find("__1_0.distcp: cut short"), std::string::npos) << message;
}

TEST_F(DistributedCheckpointDamage, AFlippedByteInAPieceFailsItsChecksum) {
  std::string bytes = testing::read_file(dir_ + "/__0_0.distcp");
  bytes[bytes.find("data/0") + 200] ^= 0x10;  // inside the data record, past its padding
  overwrite_with(dir_ + "/__0_0.distcp", bytes);
  const std::string message = message_of([&] { read_distributed_checkpoint(dir_); });
  EXPECT_NE(message.find("__0_0.distcp"), std::string::npos) << message;
}

TEST_F(DistributedCheckpointDamage, TheMetadataOfAnotherSaveIsRefused) {
  const std::string other = testing::make_temp_dir("dcp_other") + "/ckpt";
  DistributedCheckpointWriter writer(other);
  writer.write_file(0, {{"w", {4, 2}, {0, 0}, torch::ones({4, 2})}});
  writer.finish();
  fs::copy_file(other + "/.metadata", dir_ + "/.metadata", fs::copy_options::overwrite_existing);
  const std::string message = message_of([&] { read_distributed_checkpoint(dir_); });
  EXPECT_NE(message.find("not of one save"), std::string::npos) << message;
}

TEST_F(DistributedCheckpointDamage, AForgedMetadataIsRefusedNeverRun) {
  overwrite_with(dir_ + "/.metadata", kForgedPickle);
  const std::string message = message_of([&] { read_distributed_checkpoint(dir_); });
  EXPECT_NE(message.find(".metadata"), std::string::npos) << message;
  EXPECT_NE(message.find("`os.system`"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists("/tmp/pwned"));
}

TEST(ShardedSafetensors, WrittenInFilesOfAtMostTheSizeGivenReadsBackThroughItsIndex) {
  const std::string dir = testing::make_temp_dir("sharded_safetensors") + "/model";
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"a", torch::randn({100})}, {"b", torch::randn({50})}, {"c", torch::randn({300})}, {"d", torch::randn({10})}};
  // 400 and 200 bytes fit a 600-byte file; 1200 bytes take one of their own, then 40.
  EXPECT_EQ(write_sharded_safetensors(dir, tensors, 600), 3u);
  EXPECT_TRUE(fs::exists(dir + "/model-00003-of-00003.safetensors"));
  const TensorFile file = read_sharded_safetensors(dir + "/" + kShardedSafetensorsIndex);
  for (const auto& [name, tensor] : tensors) EXPECT_TRUE(torch::equal(file.find(name), tensor)) << name;

  fs::remove(dir + "/model-00002-of-00003.safetensors");
  const std::string message = message_of([&] { read_sharded_safetensors(dir); });
  EXPECT_NE(message.find("model-00002-of-00003.safetensors: missing (the index"), std::string::npos) << message;
}

// --save-weights DIR/: the model's state dict as a folder of sharded safetensors.
TEST(ShardedSafetensors, WeightsSavedToAPathEndingInASlashAreAFolderOfShardsWithAnIndex) {
  const std::string dir = testing::make_temp_dir("sharded_weights") + "/weights/";
  torch::manual_seed(0);
  torch::nn::Linear model(7, 3);
  save_weights(*model, dir);
  EXPECT_TRUE(fs::exists(dir + kShardedSafetensorsIndex));
  const TensorFile file = read_model_weights(dir);
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(file.find("weight"), model->weight));
  EXPECT_TRUE(torch::equal(file.find("bias"), model->bias));
}

// PyTorch's Hugging Face writer saves each rank's pieces with their offsets in DCP_SHARDING_INFO.
TEST(ShardedSafetensors, PiecesWithShardingInfoArePutTogetherAndAGapIsNamed) {
  const std::string dir = testing::make_temp_dir("dcp_sharding_info");
  const torch::Tensor whole = torch::randn({6, 4});
  save_safetensors(dir + "/shard-00001-model-00001-of-00001.safetensors", {{"w", whole.narrow(0, 0, 4)}},
                   {{"DCP_SHARDING_INFO", R"({"w": {"saved_offsets": [0, 0]}})"}});
  save_safetensors(dir + "/shard-00002-model-00001-of-00001.safetensors", {{"w", whole.narrow(0, 4, 2)}},
                   {{"DCP_SHARDING_INFO", R"({"w": {"saved_offsets": [4, 0]}})"}});
  EXPECT_TRUE(torch::equal(read_sharded_safetensors(dir).find("w"), whole));

  save_safetensors(dir + "/shard-00002-model-00001-of-00001.safetensors", {{"w", whole.narrow(0, 5, 1)}},
                   {{"DCP_SHARDING_INFO", R"({"w": {"saved_offsets": [5, 0]}})"}});
  const std::string message = message_of([&] { read_sharded_safetensors(dir); });
  EXPECT_NE(message.find("the pieces of 'w' hold 20 elements and span a tensor of 24"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::checkpoint
