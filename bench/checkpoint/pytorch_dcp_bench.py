#!/usr/bin/env python3
"""PyTorch's side of `tandem bench checkpoint`: dcp.save and dcp.load of the wide MLP's state dict (LAYERS layers
of WIDTH x WIDTH and their biases, then WIDTH -> 10; random float32 on the CPU), one process without a process
group, to the folder DIR, which is removed after. The load goes into tensors allocated before the clock starts,
and is checked against what was saved. Writes {"write_seconds": ..., "read_seconds": ..., "bytes": ...} to OUT.
Needs a PyTorch 2.x with torch.distributed.checkpoint (the checkout's .venv).

  .venv/bin/python bench/checkpoint/pytorch_dcp_bench.py --layers 3 --width 8192 --dir /tmp/x --out result.json
"""
import argparse
import json
import shutil
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

# DCP warns at each single-process save and load; a process of its own is this benchmark's intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--dir", required=True, help="the checkpoint's folder (must not exist; removed after)")
    parser.add_argument("--out", required=True, help="the result's JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = {}
    for layer in range(args.layers):
        state[f"layers.{layer}.weight"] = torch.randn(args.width, args.width)
        state[f"layers.{layer}.bias"] = torch.randn(args.width)
    state["output.weight"] = torch.randn(10, args.width)
    state["output.bias"] = torch.randn(10)
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=args.dir)
    write_seconds = time.perf_counter() - start
    loaded = {name: torch.empty_like(tensor) for name, tensor in state.items()}
    start = time.perf_counter()
    dcp.load(loaded, checkpoint_id=args.dir)
    read_seconds = time.perf_counter() - start
    if not all(torch.equal(loaded[name], tensor) for name, tensor in state.items()):
        raise SystemExit("pytorch_dcp_bench.py: error: the checkpoint read back differs from the one written")
    shutil.rmtree(args.dir)
    with open(args.out, "w") as out:
        json.dump({"write_seconds": write_seconds, "read_seconds": read_seconds,
                   "bytes": sum(t.numel() * t.element_size() for t in state.values())}, out)


if __name__ == "__main__":
    main()
