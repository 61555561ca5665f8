#pragma once
// The image-folder transforms' defaults for a training resolution, chosen so that small images still show
// their object (docs/data_pipeline.md).
#include <cstdint>

namespace tandem::data {

// The training crop's default smallest area fraction for --image-size `image_size`: the one that keeps the
// smallest crop at torchvision's 0.08 * 224^2 pixels (about 63x63) of output, i.e. 0.08 at 224 and above,
// 0.32 at 112, 0.98 at 64, and 1 (whole image, aspect jitter and flip only) at 32. An 8% crop of a thumbnail is a
// few source pixels across and rarely still shows the object: on Fashion-MNIST at 32 px, ResNet-18 reached 83.6%
// in 5 epochs with a 0.56 floor and 87.0% with 1.
double default_min_crop_scale(int64_t image_size);

// Validation resizes the shorter side to image_size * this, then center-crops image_size: torchvision's 256/224
// at 224 and above, nearer 1 as the resolution falls (1.02 at 32), because small images (Fashion-MNIST's 28 px
// garments fill the frame) lose their edges to the crop and then no longer look like the training crops, which
// cover up to the whole image.
double default_val_resize_ratio(int64_t image_size);

}  // namespace tandem::data
