// The image folder's decoding on arbitrary bytes, as ImageFolderDataset runs it: read_encoded_image (format by
// content, the header, the pixel limit), decode_image through libjpeg-turbo (src/data/jpeg_decoder.cpp) or stb's
// PNG decoder (src/data/stb_implementation.cpp), at full size or reduced in the DCT domain, then a crop of the
// declared size mapped onto the decoded image and resampled (image_transform.h, image_resample.h). A clean
// refusal is InvalidArgument; anything else escapes and libFuzzer reports it.
#include <vector>

#include "fuzz/fuzz_input_file.h"
#include "tandem/data/image.h"
#include "tandem/data/image_transform.h"
#include "tandem/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::data;
  const std::string& path = tandem::fuzz::write_input_file(data, size);
  try {
    const EncodedImage encoded = read_encoded_image(path);
    // The validation crop (deterministic) at an output small enough for every reduction to be reachable.
    ImageTransformOptions options;
    options.image_size = 4;
    SeededRandom random{0, 0, 0};
    const CropPlan crop = plan_crop(encoded.width, encoded.height, options, random);
    // Each input is decoded at one reduction that its size picks, so that all four are fuzzed.
    const Image image = decode_image(encoded, 1 << (size % 4));
    std::vector<float> out(3 * 4 * 4);
    render_crop(image, encoded.width, encoded.height, crop, options, out.data());
  } catch (const tandem::InvalidArgument&) {
  }
  return 0;
}
