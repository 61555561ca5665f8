// The one translation unit that compiles stb's image decoder and writer (header-only libraries), so
// that tandem needs stb's headers only, not a prebuilt library.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
// Only the PNG decoder: JPEG goes to libjpeg-turbo (jpeg_decoder.h). stb picks a decoder by a file's content,
// not its name, so every decoder compiled in is reachable from any file in the folder, and each one left out is
// code a damaged or crafted file cannot reach.
#define STBI_ONLY_PNG
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>
