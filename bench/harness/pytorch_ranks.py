"""What the PyTorch side scripts of `tandem bench` share: their flags' number types, and starting one process per
rank on 127.0.0.1 under a deadline, so that a hung rank fails the bench instead of stalling it.

Imported by bench/train/pytorch_ddp_bench.py, pytorch_end_to_end.py and pytorch_fsdp_bench.py, and by
bench/overhead/pytorch_overhead_bench.py, each of which puts this folder on its sys.path.
"""
import argparse
import math
import os
import socket
import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def whole_number_from(minimum):
    """An argparse type: a whole number of at least `minimum`, refused with one line that says so."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, not {text}")
        return value
    return parse


def positive_real(text):
    """An argparse type: a finite real above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number greater than 0, not {text}")
    return value


def run_ranks(script, worker, world, args, deadline):
    """Runs worker(rank, args, port, results) in `world` spawned processes and returns `results`, the queue they
    put into. Exits with one line naming `script` where a rank is still running after `deadline` seconds (it is
    stopped) or failed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    processes = [context.Process(target=worker, args=(rank, args, port, results)) for rank in range(world)]
    for p in processes:
        p.start()
    end = time.monotonic() + deadline
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
    hung = [rank for rank, p in enumerate(processes) if p.is_alive()]
    for rank in hung:
        processes[rank].kill()
        processes[rank].join()
    if hung:
        sys.exit(f"{script}: error: rank(s) {hung} still running after {deadline:.0f} s; stopped them")
    failed = [rank for rank, p in enumerate(processes) if p.exitcode != 0]
    if failed:
        sys.exit(f"{script}: error: rank(s) {failed} failed")
    return results


def leave_process_group():
    """Ends a rank once every rank is done, without tearing the process group down: PyTorch 1.13's
    destroy_process_group (or the group's destructor at exit) can deadlock, joining ProcessGroupGloo's worker
    threads while holding the GIL that a worker finishing a future waits for (seen in gdb, about one run in ten).
    Whatever the rank reports must already be sent (a SimpleQueue's put has written it to its pipe) or flushed."""
    dist.barrier()
    os._exit(0)
