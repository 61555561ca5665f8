// The one translation unit that compiles stb's image decoder, writer and resizer (header-only libraries), so
// that tandem needs stb's headers only, not a prebuilt library.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
