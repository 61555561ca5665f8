#!/usr/bin/python3
"""A lean seed-style PyTorch training script: the other side of `tandem bench train --end-to-end`.

What a user who knows PyTorch would write for the main job, with nothing tandem's `tandem train` adds (no records,
no progress bar, no checkpoints): the seeds' CNN under DistributedDataParallel over gloo on 127.0.0.1, one process
per rank started here, one intra-op thread each, Fashion-MNIST's training images loaded into in-memory tensors and
normalised as tandem does, each rank's batches indexed with a seeded shuffle split among the ranks as
DistributedSampler splits it, SGD with tandem train's default momentum, weight decay and learning rate (times the
world size), and loss.item() read every step, as the seeds read it to print.

The bench times the whole process from the outside at two step counts and takes the difference, so that start-up
and data loading cancel; this script prints only rank 0's last loss.

  /usr/bin/python3 bench/train/pytorch_end_to_end.py --nproc 2 --steps 240
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pytorch_ranks.py, shared by every benchmark's PyTorch side, lives in bench/harness/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
# The same CNN and IDX reader as the per-step comparison, so that both benches time one model.
from pytorch_ddp_bench import CNNNet, FASHION_MNIST, MEAN, STD, read_idx  # noqa: E402
from pytorch_ranks import leave_process_group, positive_real, run_ranks, whole_number_from  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def load_training_set(data_dir):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    return images.float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1), labels.long()


def worker(rank, args, port, _results):
    torch.set_num_threads(args.threads)
    world = args.nproc
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(CNNNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9, weight_decay=0.005)
    loss_function = torch.nn.CrossEntropyLoss()
    x, y = load_training_set(args.data)
    batches_per_epoch = x.shape[0] // (args.batch_size * world)
    step, epoch, loss_value = 0, 0, float("nan")
    while step < args.steps:
        # Every rank draws the same permutation and takes every world-th index of it, as DistributedSampler does.
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed + epoch))[rank::world]
        for b in range(batches_per_epoch):
            if step == args.steps:
                break
            index = order[b * args.batch_size:(b + 1) * args.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_function(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
            step += 1
        epoch += 1
    if rank == 0:
        print(f"step {step} loss {loss_value:.4f}", flush=True)
    leave_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=whole_number_from(1), default=2, help="processes (world size)")
    parser.add_argument("--steps", type=whole_number_from(1), default=240, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=whole_number_from(1), default=64, help="samples per process per step")
    parser.add_argument("--threads", type=whole_number_from(1), default=1, help="intra-op threads per process")
    parser.add_argument("--lr", type=positive_real, default=0.01, help="learning rate per process (times the world size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=positive_real, default=300,
                        help="seconds before a run that has not finished is stopped and reported as hung")
    parser.add_argument("--data", default=FASHION_MNIST, help="folder of Fashion-MNIST's IDX files (.gz)")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.data, "train-images-idx3-ubyte.gz")):
        sys.exit(f"pytorch_end_to_end.py: error: no train-images-idx3-ubyte.gz in {args.data}; pass --data DIR")

    run_ranks("pytorch_end_to_end.py", worker, args.nproc, args, args.deadline)


if __name__ == "__main__":
    main()
