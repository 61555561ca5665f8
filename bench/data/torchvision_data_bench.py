#!/usr/bin/python3
"""The torchvision side of `tandem bench data`: images per second of ImageFolder + DataLoader over whole epochs
of an image folder, with the training transforms of torchvision's ImageNet recipe (RandomResizedCrop,
RandomHorizontalFlip, ToTensor, Normalize) decoded by PIL in --workers worker processes. Prints one JSON line
{"images": ..., "seconds": ...} for the timed epochs; everything else goes to stderr.
"""
import argparse
import json
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="image folder: one sub-folder of images per class")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="untimed epochs first (workers start here)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(args.image_size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = torchvision.datasets.ImageFolder(args.data, transform)
    # persistent_workers: the workers start once, in the warm-up, as tandem's threads do.
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, drop_last=False)
    images = 0
    start = time.perf_counter()
    for epoch in range(args.warmup_epochs + args.epochs):
        if epoch == args.warmup_epochs:
            start = time.perf_counter()
        for data, _ in loader:
            if epoch >= args.warmup_epochs:
                images += data.shape[0]
    seconds = time.perf_counter() - start
    print(f"torchvision {torchvision.__version__}, torch {torch.__version__}: {images / seconds:.0f} images/s",
          file=sys.stderr)
    print(json.dumps({"images": images, "seconds": seconds}))


if __name__ == "__main__":
    main()
