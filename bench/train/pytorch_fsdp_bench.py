#!/usr/bin/python3
"""PyTorch's FSDP2 (`fully_shard`) on the configuration `tandem bench train --strategy fsdp --compare pytorch`
times, for a side-by-side figure with tandem::fsdp.

The model, data, optimizer and timing are pytorch_ddp_bench.py's (the seeds' CNN or ResNet-18, random images
made before timing, SGD with momentum 0.9 and weight decay 0.005, the slowest rank's time per repeat). The
sharding is tandem's default: `fully_shard` on each direct child that has parameters, then on the root, over a
one-dimensional mesh of all ranks, float32 throughout, on Gloo (or NCCL) on 127.0.0.1.

Prints one JSON object on stdout (rank 0), shaped as pytorch_ddp_bench.py's.

Needs PyTorch 2.6 or later (torch.distributed.fsdp.fully_shard): the virtual environment that
`scripts/build --libtorch pypi` makes (.venv/bin/python); Debian's python3-torch (1.13) has no FSDP2.

  .venv/bin/python bench/train/pytorch_fsdp_bench.py --nproc 2 --model resnet18 --image-size 32
  .venv/bin/python bench/train/pytorch_fsdp_bench.py --nproc 2 --mode independent   # no communication: the baseline
"""
import argparse
import os
import sys

try:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
except ImportError:
    sys.exit("pytorch_fsdp_bench.py: error: this Python has no torch.distributed.fsdp.fully_shard (PyTorch 2.6 or "
             "later); run it with .venv/bin/python (scripts/build --libtorch pypi makes it)")

# pytorch_ranks.py, shared by every benchmark's PyTorch side, lives in bench/harness/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))

from pytorch_ddp_bench import add_timing_arguments, print_timing, time_steps  # noqa: E402
from pytorch_ranks import run_ranks  # noqa: E402


def true_or_false(text):
    """An argparse type: true or false, as tandem's flag takes them."""
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false, not {text}")
    return text == "true"


def model_device(model):
    return next(model.parameters()).device


def shard(model, device, world, reshard_after_forward):
    """tandem's default units: each direct child with parameters, then the root for what is left."""
    mesh = init_device_mesh(device.type, (world,))
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def worker(rank, args, port, results):
    def wrap(model):
        shard(model, model_device(model), args.nproc, args.reshard_after_forward)
        return model

    time_steps(rank, args, port, results, args.mode == "fsdp" and args.nproc > 1, wrap)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_arguments(parser, model="resnet18", image_size=32, deadline=600, data="random")
    parser.add_argument("--mode", choices=["fsdp", "independent"], default="fsdp",
                        help="fsdp: fully_shard over all ranks; independent: the same steps with no communication")
    parser.add_argument("--reshard-after-forward", type=true_or_false, default=True,
                        help="true: free each unit's parameters after its forward; false: keep them until backward")
    args = parser.parse_args()
    result = run_ranks("pytorch_fsdp_bench.py", worker, args.nproc, args, args.deadline).get()
    print_timing(args, result, reshard_after_forward=args.reshard_after_forward)

if __name__ == "__main__":
    main()
