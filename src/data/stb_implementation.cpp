// The one translation unit that compiles stb's image decoder, writer and resizer (header-only libraries), so
// that tandem needs stb's headers only, not a prebuilt library.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
// Only the decoders for the files an image folder takes (.jpg, .jpeg, .png). stb picks a decoder by a file's
// content, not its name, so every decoder compiled in is reachable from any file in the folder, and each one
// left out is code a damaged or crafted file cannot reach.
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
