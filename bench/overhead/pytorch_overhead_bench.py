#!/usr/bin/python3
"""PyTorch's side of `tandem bench overhead`: the host's cost of one training step where compute is negligible.

A 32-32-10 MLP (Linear, ReLU, Linear), batch 8 per process, cross-entropy, SGD with momentum 0.9, one intra-op
thread, gradients dropped before each step (zero_grad(set_to_none=True)). `--mode plain` times the unwrapped
model in one process; `--mode ddp` wraps it in DistributedDataParallel over Gloo on 127.0.0.1 at world size
--nproc (1 included: DDP's own cost with nobody to talk to) and also times one all-reduce of the gradients'
size alone.

Prints one JSON object on stdout (rank 0):
  {"framework": "pytorch", "mode": "ddp", "world_size": 2, "us_per_step_median": ..., "repeats": [...],
   "allreduce_us": ...}

Needs Debian's python3-torch (apt-get install -y python3-torch); installs nothing itself.

  /usr/bin/python3 bench/overhead/pytorch_overhead_bench.py --mode ddp --nproc 2
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ImportError:
    sys.exit("pytorch_overhead_bench.py: error: this Python has no torch; run it with Debian's /usr/bin/python3 "
             "after apt-get install -y python3-torch")

# pytorch_ranks.py, shared by every benchmark's PyTorch side, lives in bench/harness/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))

from pytorch_ranks import leave_process_group, run_ranks, whole_number_from  # noqa: E402

INPUTS, HIDDEN, CLASSES = 32, 32, 10
BATCHES = 4  # the steps cycle through a few batches made before timing, as tandem's side does


def slowest(value, distributed):
    """The slowest rank's figure: a synchronous job goes at its pace."""
    if not distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def allreduce_latency_us(elements):
    flat = torch.zeros(elements)
    for _ in range(50):
        dist.all_reduce(flat)
    times = []
    for _ in range(500):
        begin = time.perf_counter()
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())  # an average, as DDP's and tandem's
        times.append((time.perf_counter() - begin) * 1e6)
    return slowest(statistics.median(times), True)


def worker(rank, args, port, results):
    torch.set_num_threads(1)
    distributed = args.mode == "ddp"
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nproc)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(INPUTS, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_function = torch.nn.CrossEntropyLoss()
    torch.manual_seed(1 + rank)
    x = torch.randn(BATCHES * args.batch_size, INPUTS)
    y = torch.randint(0, CLASSES, (BATCHES * args.batch_size,))

    def step(i):
        start = (i % BATCHES) * args.batch_size
        optimizer.zero_grad(set_to_none=True)
        loss_function(model(x[start:start + args.batch_size]), y[start:start + args.batch_size]).backward()
        optimizer.step()

    for i in range(args.warmup):
        step(i)
    repeats = []
    for r in range(args.repeats):
        if distributed:
            dist.barrier()
        begin = time.perf_counter()
        for i in range(args.steps):
            step(args.warmup + r * args.steps + i)
        repeats.append(slowest((time.perf_counter() - begin) * 1e6 / args.steps, distributed))
    allreduce_us = allreduce_latency_us(sum(p.numel() for p in model.parameters())) if distributed else 0.0
    if rank == 0:
        results.put({"repeats": repeats, "allreduce_us": allreduce_us})  # written to the pipe before put returns
    if distributed:
        leave_process_group()


def run(args):
    """Runs the workers (one for --mode plain) and returns rank 0's result; exits with one line on a failure."""
    world = args.nproc if args.mode == "ddp" else 1
    return run_ranks("pytorch_overhead_bench.py", worker, world, args, args.deadline).get()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plain", "ddp"], default="ddp",
                        help="plain: the unwrapped model in one process; ddp: DistributedDataParallel over Gloo")
    parser.add_argument("--nproc", type=whole_number_from(1), default=2, help="--mode ddp: processes (world size)")
    parser.add_argument("--batch-size", type=whole_number_from(1), default=8, help="samples per process per step")
    parser.add_argument("--steps", type=whole_number_from(1), default=200, help="timed steps per repeat")
    parser.add_argument("--repeats", type=whole_number_from(1), default=5, help="timed repeats (the median is reported)")
    parser.add_argument("--warmup", type=whole_number_from(0), default=50, help="untimed steps first")
    parser.add_argument("--deadline", type=whole_number_from(1), default=300,
                        help="seconds before a run that has not finished is stopped and reported as hung")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args)
    repeats = result["repeats"]
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "mode": args.mode,
        "world_size": args.nproc if args.mode == "ddp" else 1,
        "batch_size": args.batch_size,
        "us_per_step_median": statistics.median(repeats),
        "repeats": repeats,
        "allreduce_us": result["allreduce_us"],
    }))


if __name__ == "__main__":
    main()
