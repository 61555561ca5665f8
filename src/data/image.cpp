#include "tandem/data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <memory>

#include "tandem/util/error.h"

namespace tandem::data {

Image read_image(const std::string& path) {
  int width = 0, height = 0, channels_in_file = 0;
  // desired_channels = 3 makes stb convert gray, gray+alpha, palette and RGBA to RGB (16-bit to 8-bit too).
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(stbi_load(path.c_str(), &width, &height, &channels_in_file, 3),
                                                  stbi_image_free);
  if (!pixels) {
    const char* reason = stbi_failure_reason();
    throw InvalidArgument("cannot decode image " + path + " (" + (reason ? reason : "unknown error") +
                          "); fix or remove the file, or skip unreadable images (--skip-bad-images)");
  }
  Image image;
  image.width = width;
  image.height = height;
  image.pixels.assign(pixels.get(), pixels.get() + static_cast<size_t>(width) * height * 3);
  return image;
}

void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels) {
  TANDEM_CHECK(channels >= 1 && channels <= 4 && width > 0 && height > 0, "bad PNG shape ", width, "x", height, "x",
               channels);
  if (!stbi_write_png(path.c_str(), width, height, channels, pixels, width * channels)) {
    throw Error("cannot write PNG file " + path + "; check that its folder exists and is writable");
  }
}

}  // namespace tandem::data
