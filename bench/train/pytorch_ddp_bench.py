#!/usr/bin/python3
"""PyTorch's own DDP on the configuration `tandem bench train --compare pytorch` times, for a side-by-side figure.

The seeds' CNN (logits, no softmax) on Fashion-MNIST, or ResNet-18 (torchvision's layout) on random RGB images,
on the CPU or a GPU, Gloo (or NCCL) on 127.0.0.1, one intra-op thread per process, batch 64 per process, SGD
with momentum 0.9 and weight decay 0.005. The batches are taken from a tensor loaded onto the device before
timing, so that the figure measures training steps, not the data loader; a GPU is synchronised before each
clock reading.

Prints one JSON object on stdout (rank 0):
  {"framework": "pytorch", "world_size": 2, "samples_per_s": ..., "ms_per_step_median": ...,
   "ms_per_step_min": ..., "ms_per_step_max": ..., "repeats": [...], ...}

Needs a Python with torch: Debian's python3-torch (`apt-get install -y python3-torch`), or the virtual
environment that `scripts/build --libtorch pypi` makes (.venv/bin/python); installs nothing itself.

  /usr/bin/python3 bench/train/pytorch_ddp_bench.py --nproc 2 --steps 20 --repeats 5
  /usr/bin/python3 bench/train/pytorch_ddp_bench.py --nproc 2 --mode independent   # no communication: the scaling baseline
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError:
    sys.exit("pytorch_ddp_bench.py: error: this Python has no torch; run it with Debian's /usr/bin/python3 after "
             "apt-get install -y python3-torch")

# pytorch_ranks.py, shared by every benchmark's PyTorch side, lives in bench/harness/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))

from pytorch_ranks import leave_process_group, positive_real, run_ranks, whole_number_from  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


class CNNNet(torch.nn.Module):
    """The seeds' CNNNet, returning logits (the seeds' softmax before cross-entropy is a bug)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, kernel_size=5, stride=1, padding=1)
        self.pool1 = torch.nn.MaxPool2d(kernel_size=2, stride=2, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, kernel_size=5, stride=1, padding=1)
        self.pool2 = torch.nn.MaxPool2d(kernel_size=2, stride=2, padding=1)
        self.conv3 = torch.nn.Conv2d(32, 32, kernel_size=5, stride=1, padding=1)
        self.fc1 = torch.nn.Linear(5 * 5 * 32, 128)
        self.fc2 = torch.nn.Linear(128, 64)
        self.output = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        x = torch.relu(self.conv3(x))
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.output(x)


class BasicBlock(torch.nn.Module):
    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out_channels)
        self.conv2 = torch.nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                                  torch.nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(torch.nn.Module):
    """torchvision's resnet18 layout (the same as tandem's --model resnet18), written here so that the bench
    needs torch alone."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(64)
        self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
        stages, in_channels = [], 64
        for stage in range(4):
            out_channels = 64 << stage
            stride = 1 if stage == 0 else 2
            stages.append(torch.nn.Sequential(BasicBlock(in_channels, out_channels, stride),
                                              BasicBlock(out_channels, out_channels, 1)))
            in_channels = out_channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = torch.nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"cnn": CNNNet, "resnet18": ResNet18}


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load_data(data_dir, limit, channels, size):
    """The first `limit` training images, normalised; random images of the model's shape if the set is absent or
    the model takes RGB."""
    images = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    labels = os.path.join(data_dir, "train-labels-idx1-ubyte.gz")
    if data_dir != "random" and channels == 1 and os.path.exists(images) and os.path.exists(labels):
        x = read_idx(images)[:limit].float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1)
        y = read_idx(labels)[:limit].long()
        return x, y, "fashion-mnist"
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(limit, channels, size, size, generator=generator),
            torch.randint(0, 10, (limit,), generator=generator), "random")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def register_comm_hook(model, args):
    """The hook `tandem bench train --comm-hook` names, PyTorch's own of the same kind."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=args.powersgd_start)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def worker(rank, args, port, results):
    def wrap(model):
        model = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                        gradient_as_bucket_view=args.gradient_as_bucket_view)
        register_comm_hook(model, args)
        return model

    time_steps(rank, args, port, results, args.mode == "ddp" and args.nproc > 1, wrap)


def time_steps(rank, args, port, results, distributed, wrap):
    """One rank's timed training (pytorch_fsdp_bench.py's too): the model of args.model, wrapped by `wrap(model)`
    where `distributed`, SGD with momentum on random images made beforehand; rank 0 puts the slowest rank's ms per
    step of each repeat into `results`."""
    torch.set_num_threads(args.threads)
    world = args.nproc
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = MODELS[args.model]().to(device)
    if distributed:
        model = wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9, weight_decay=0.005)
    loss_function = torch.nn.CrossEntropyLoss()
    channels = 1 if args.model == "cnn" else 3
    x, y, source = load_data(args.data, args.batch_size * world * 16, channels, args.image_size)
    x, y = x.to(device), y.to(device)
    batches = x.shape[0] // (args.batch_size * world)

    def step(i):
        # Rank r takes every world-th sample, as DistributedSampler without shuffling does.
        start = (i % batches) * args.batch_size * world
        index = torch.arange(start + rank, start + args.batch_size * world, world, device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_function(model(x[index]), y[index])
        loss.backward()
        optimizer.step()

    for i in range(args.warmup):
        step(i)
    repeats = []
    for r in range(args.repeats):
        synchronize(device)
        if distributed:
            dist.barrier()
        begin = time.perf_counter()
        for i in range(args.steps):
            step(args.warmup + r * args.steps + i)
        synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - begin], dtype=torch.float64, device=device)
        if distributed:
            # The slowest rank sets the pace of a synchronous job.
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        repeats.append(elapsed.item() * 1000.0 / args.steps)
    if rank == 0:
        results.put({"repeats": repeats, "data": source})  # written to the pipe before put returns
    if distributed:
        leave_process_group()


def add_timing_arguments(parser, model, image_size, deadline, data):
    """The arguments every PyTorch training benchmark here takes (pytorch_fsdp_bench.py's too), with its defaults."""
    parser.add_argument("--nproc", type=whole_number_from(1), default=2, help="processes (world size)")
    parser.add_argument("--model", choices=sorted(MODELS), default=model, help="the seeds' CNN or ResNet-18")
    parser.add_argument("--image-size", type=whole_number_from(1), default=image_size,
                        help="square input size (the CNN takes 28)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: rank r on GPU r (modulo the GPUs)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="the process group's backend")
    parser.add_argument("--batch-size", type=whole_number_from(1), default=64, help="samples per process per step")
    parser.add_argument("--threads", type=whole_number_from(1), default=1, help="intra-op threads per process")
    parser.add_argument("--steps", type=whole_number_from(1), default=20, help="timed steps per repeat")
    parser.add_argument("--repeats", type=whole_number_from(1), default=5, help="timed repeats (median and spread over them)")
    parser.add_argument("--warmup", type=whole_number_from(0), default=10, help="untimed steps first")
    parser.add_argument("--lr", type=positive_real, default=0.01, help="base learning rate (times the world size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=positive_real, default=deadline,
                        help="seconds before a run that has not finished is stopped and reported as hung")
    parser.add_argument("--data", default=data,
                        help="MNIST-format folder, or 'random' for random images of the same shape")


def print_timing(args, result, **settings):
    """Prints rank 0's result as the one JSON object the bench driver reads; `settings` adds the caller's own."""
    repeats = result["repeats"]
    median = statistics.median(repeats)
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "mode": args.mode,
        "model": args.model,
        "device": args.device,
        "backend": args.backend,
        "world_size": args.nproc,
        "batch_size": args.batch_size,
        "threads": args.threads,
        **settings,
        "data": result["data"],
        "samples_per_s": args.batch_size * args.nproc * 1000.0 / median,
        "ms_per_step_median": median,
        "ms_per_step_min": min(repeats),
        "ms_per_step_max": max(repeats),
        "repeats": repeats,
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_arguments(parser, model="cnn", image_size=28, deadline=300, data=FASHION_MNIST)
    parser.add_argument("--mode", choices=["ddp", "independent"], default="ddp",
                        help="ddp: PyTorch DDP over Gloo; independent: the same steps with no communication")
    parser.add_argument("--bucket-cap-mb", type=positive_real, default=25, help="DDP bucket size in MiB")
    parser.add_argument("--gradient-as-bucket-view", action="store_true", help="DDP's gradient_as_bucket_view")
    parser.add_argument("--comm-hook", choices=["average", "fp16", "bf16", "powersgd"], default="average",
                        help="how DDP reduces each bucket (average: no hook)")
    parser.add_argument("--powersgd-rank", type=whole_number_from(1), default=1, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--powersgd-start", type=whole_number_from(2), default=2, help="PowerSGD's start_powerSGD_iter")
    args = parser.parse_args()
    print_timing(args, run_ranks("pytorch_ddp_bench.py", worker, args.nproc, args, args.deadline).get())

if __name__ == "__main__":
    main()
