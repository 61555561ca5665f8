#!/usr/bin/env python3
"""The `tandem bench recovery` measurement, taken on PyTorch's TorchFT (pip package `torchft`) for a side-by-side
reference: how fast data-parallel training goes on after one worker is SIGKILLed.

The job: a TorchFT lighthouse on loopback, then N replica groups of one process each (world size 1 inside a
group), each training with torchft's Manager, its fault-tolerant DistributedDataParallel (with one fix, see
surviving_ddp_class) and its optimizer wrapper over torchft's reconfigurable ProcessGroupGloo (SGD, lr 0.01,
momentum 0.9). Every replica appends one JSON line per committed step to its own steps file: {"step", "time" (unix
time at the step's end), "participants" (the replicas in that step's quorum, from the manager), "replica"}.

Once replica 0's file holds step --kill-after, the driver SIGKILLs replica 1's process from outside (as a failed
machine would: no message, no flush), notes the time, and at once starts the same command again, as a restart
policy would. The lighthouse needs only N-1 replicas for a quorum, so the survivors go on without it; the new
process joins a later quorum and heals from a live peer (TorchFT's live checkpoint transfer over HTTP).

When the run ends (every live replica at --steps, or the deadline), it prints one JSON object from replica 0's file,
with the same definitions as `tandem bench recovery`:
  last_step_before_kill     the newest step replica 0 had logged when the kill was sent
  kill_to_first_new_step_s  end time of the step after that one, minus the kill time
  steps_trained_again       records of steps <= last_step_before_kill written after the kill (TorchFT never
                            numbers a failed step, so this is 0 by construction; the step in flight at the kill is
                            lost, then trained under the same number)
  kill_to_full_size_s       end time of the first step after the kill with all N replicas in its quorum, minus the
                            kill time (null if none within the run); the step in which the new process heals does
                            not count it, as it only receives the state that step and adds zero gradients

TorchFT's timeouts decide most of these numbers: the survivors cannot form a new quorum until the lighthouse stops
counting the dead replica as healthy (--heartbeat-timeout-ms), and they wait for a healthy replica that has not
asked to join for at most --join-timeout-ms. The defaults are the ones the `torchft_lighthouse` CLI and Manager ship
with, so the numbers show TorchFT as it comes.

The same file runs the lighthouse and the replicas (--role); run it without --role to drive a measurement.
Every process it starts is killed when it ends, however it ends, and --deadline-s bounds the whole run.
"""

import argparse
import ctypes
import gzip
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# How often the driver reads replica 0's steps file while it waits for the kill's step.
POLL_S = 0.01


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: torchft_recovery.py --replicas 3 --steps 300 --kill-after 100",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--replicas", type=int, default=3, choices=[2, 3, 4], help="replica groups (one process each)")
    p.add_argument("--steps", type=int, default=300, help="steps each replica trains")
    p.add_argument("--kill-after", type=int, default=100, help="SIGKILL replica 1 once replica 0 has logged this step")
    p.add_argument("--batch-size", type=int, default=32, help="examples per replica per step")
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                   help="cnn: tandem's `cnn` (the seeds' CNNNet, ~0.15M parameters); mlp: 784-128-10")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="MNIST-format folder (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz); "
                        "random images if it is missing")
    p.add_argument("--work-dir", help="where the steps files and process logs go; None: a new folder in /tmp")
    p.add_argument("--deadline-s", type=float, default=300, help="the whole run is killed past this")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                   help="lighthouse: a replica silent this long is dead (torchft's default)")
    p.add_argument("--join-timeout-ms", type=int, default=60000,
                   help="lighthouse: longest wait for healthy replicas that have not joined (torchft's default)")
    p.add_argument("--quorum-tick-ms", type=int, default=100,
                   help="lighthouse: how often it re-checks a pending quorum (torchft's default)")
    p.add_argument("--timeout-s", type=float, default=60,
                   help="Manager and Gloo timeout for collectives, commits and checkpoint transfer; also the "
                        "quorum timeout (torchft's default)")
    p.add_argument("--role", choices=["driver", "lighthouse", "replica"], default="driver",
                   help="internal: the driver starts this file again as the lighthouse and as each replica")
    args = p.parse_args(argv)
    if not 0 < args.kill_after < args.steps:
        p.error("--kill-after must be between 0 and --steps")
    return args


def die_with_parent():
    """Runs in each child before exec: the kernel SIGKILLs it if the driver dies, even by SIGKILL."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------
# The lighthouse: torchft's quorum server, in its own process so that the driver stays free of torch.


def run_lighthouse(args):
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0",  # loopback only; port 0 lets the kernel pick a free one
        min_replicas=args.replicas - 1,  # training goes on with one replica lost
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    # address() names the host; the replicas reach it on loopback, so only the port is passed on.
    print(server.address().rsplit(":", 1)[1], flush=True)
    signal.pause()  # serves from its own threads until the driver kills this process


# ---------------------------------------------------------------------------------------------------------------
# A replica group: one process, world size 1 inside the group.


def read_idx(path):
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]  # IDX header: two zero bytes, a type byte (0x08: unsigned byte), the number of dimensions
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_data(folder, log):
    import torch

    images_path = Path(folder) / "train-images-idx3-ubyte.gz"
    labels_path = Path(folder) / "train-labels-idx1-ubyte.gz"
    if images_path.exists() and labels_path.exists():
        images = torch.from_numpy(read_idx(images_path).copy()).float().div_(255).unsqueeze(1)
        labels = torch.from_numpy(read_idx(labels_path).astype("int64"))
        return images, labels
    log(f"{folder} holds no MNIST-format training set: training on random images")
    gen = torch.Generator().manual_seed(0)
    return torch.rand(4096, 1, 28, 28, generator=gen), torch.randint(0, 10, (4096,), generator=gen)


def make_model(name):
    from torch import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    # tandem's `cnn` (include/tandem/nn/cnn_net.h), layer for layer: three 5x5 convolutions with padding 1, 2x2
    # max-pools with padding 1 after the first two, then 800-128-64-10 fully connected; ReLU after each hidden layer.
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=1), nn.MaxPool2d(2, 2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 5, padding=1), nn.MaxPool2d(2, 2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 5, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def surviving_ddp_class():
    """torchft's DistributedDataParallel with a gradient hook that survives a lost peer.

    torchft 0.2.0's own hook waits on the Manager's allreduce and then asserts that the work produced a future. When
    Gloo's allreduce fails because a peer died (the connection is reset), the Manager's wait() catches the error and
    records it so that the step is not committed, but then no future exists and the assertion kills the survivor: a
    kill that lands during an allreduce took every replica down with it in a trial of this script. This hook keeps
    the Manager's own error path (the failed step is dropped at should_commit, and the next quorum reconfigures the
    process group) and hands DDP the bucket itself, which holds the quorum's average when the allreduce succeeded,
    and is discarded with the step when it failed.
    """
    import torch
    from torchft import DistributedDataParallel

    class SurvivingDistributedDataParallel(DistributedDataParallel):
        @staticmethod
        def _comm_hook(manager, bucket):
            manager.allreduce(bucket.buffer()).wait()  # averages in place; on failure, records the error
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

    return SurvivingDistributedDataParallel


def run_replica(args):
    import datetime

    import torch
    import torch.nn.functional as F
    from torchft import Manager, Optimizer, ProcessGroupGloo

    # The replica group as torchft's examples configure one; TORCHFT_LIGHTHOUSE is read by the Manager itself.
    replica = int(os.environ["REPLICA_GROUP_ID"])
    num_replicas = int(os.environ["NUM_REPLICA_GROUPS"])

    def log(msg):
        print(f"replica {replica}: {msg}", file=sys.stderr, flush=True)

    # One thread per replica: up to 4 replicas share a 2-core machine, and more threads would only contend.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images, labels = load_data(args.data, log)
    model = make_model(args.model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    # What a healing replica receives from a live peer: the weights and the optimizer's momentum.
    def state_dict():
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        sgd.load_state_dict(state["optim"])

    # The Manager needs a TCPStore for its group; with one process per group, this process hosts it.
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=num_replicas - 1,  # commit steps with one replica lost
        timeout=timeout,
        quorum_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        replica_id=f"replica_{replica}",
        hostname="127.0.0.1",  # what peers dial for this replica's manager: loopback
    )
    ddp = surviving_ddp_class()(manager, model)
    optimizer = Optimizer(manager, sgd)

    # Each replica reads its own shard: committed step s on replica r takes batch s * N + r of the training set,
    # so a healed replica picks up at the step it healed to.
    per_epoch = len(images) // args.batch_size
    with open(Path(args.work_dir) / f"steps-{replica}.jsonl", "a") as steps_file:
        while manager.current_step() < args.steps:
            step = manager.current_step()
            first = (step * num_replicas + replica) % per_epoch * args.batch_size
            x, y = images[first:first + args.batch_size], labels[first:first + args.batch_size]
            optimizer.zero_grad()  # starts this step's quorum (healing, if this replica is behind)
            F.cross_entropy(ddp(x), y).backward()  # gradients are averaged over the quorum by torchft's allreduce
            optimizer.step()  # steps SGD only if the Manager commits: no error, enough replicas in the quorum
            if manager.current_step() > step:
                record = {"step": manager.current_step(), "time": time.time(),
                          "participants": manager.num_participants(), "replica": replica}
                steps_file.write(json.dumps(record) + "\n")
                steps_file.flush()  # the driver reads this file while the run goes on
    manager.shutdown(wait=False)


# ---------------------------------------------------------------------------------------------------------------
# The driver.


def read_steps(path):
    """The records in a steps file; a line still being written is skipped."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    records.append(json.loads(line))
    except FileNotFoundError:
        pass
    return records


def newest_step(records):
    return max((r["step"] for r in records), default=0)


class Run:
    """The processes of one measurement; stop() kills whichever of them are still running."""

    def __init__(self, args, work_dir):
        self.args = args
        self.work_dir = work_dir
        self.procs = []  # every process started, the lighthouse first
        self.start = time.monotonic()

    def left_s(self):
        return self.args.deadline_s - (time.monotonic() - self.start)

    def spawn(self, role, name, env=None, stdout=subprocess.DEVNULL):
        command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--role", role,
                   "--work-dir", str(self.work_dir)]
        with open(self.work_dir / f"{name}.log", "ab") as err:
            proc = subprocess.Popen(command, stdout=stdout, stderr=err, env={**os.environ, **(env or {})},
                                    preexec_fn=die_with_parent)
        self.procs.append(proc)
        return proc

    def start_lighthouse(self):
        proc = self.spawn("lighthouse", "lighthouse", stdout=subprocess.PIPE)
        # Its first line is its port; it may take a while (it imports torch), but not past the deadline.
        ready, _, _ = select.select([proc.stdout], [], [], max(self.left_s(), 0))
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            raise RuntimeError(f"the lighthouse did not start; see {self.work_dir / 'lighthouse.log'}")
        return f"http://127.0.0.1:{line}"

    def start_replica(self, replica, lighthouse):
        env = {"REPLICA_GROUP_ID": str(replica), "NUM_REPLICA_GROUPS": str(self.args.replicas),
               "TORCHFT_LIGHTHOUSE": lighthouse,
               "GLOO_SOCKET_IFNAME": "lo"}  # Gloo's connections between replicas stay on loopback
        return self.spawn("replica", f"replica-{replica}", env)

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()


def drive(args):
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="torchft-recovery-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"steps files and process logs in {work_dir}", file=sys.stderr)
    steps_path = work_dir / "steps-0.jsonl"
    run = Run(args, work_dir)
    # SIGTERM and SIGHUP end the driver through the finally below, so that its processes go with it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        lighthouse = run.start_lighthouse()
        replicas = {r: run.start_replica(r, lighthouse) for r in range(args.replicas)}

        while newest_step(read_steps(steps_path)) < args.kill_after:
            if replicas[0].poll() is not None or run.left_s() <= 0:
                raise RuntimeError(f"replica 0 never reached step {args.kill_after}; see {work_dir}")
            time.sleep(POLL_S)
        victim = replicas[1]
        victim.kill()  # SIGKILL
        kill_time = time.time()
        # By the record times, not by what the file holds now: a step whose allreduce was done may still commit on
        # replica 0 after the kill (a commit is decided inside each replica group).
        last_before_kill = newest_step(r for r in read_steps(steps_path) if r["time"] <= kill_time)
        victim.wait()
        replicas[1] = run.start_replica(1, lighthouse)  # what a restart policy would do
        print(f"killed replica 1 after step {last_before_kill}; restarted it", file=sys.stderr)

        # Replica 0 is the one measured: once it has failed, the others are not waited for.
        while (any(p.poll() is None for p in replicas.values()) and replicas[0].returncode in (None, 0)
               and run.left_s() > 0):
            time.sleep(0.1)
        failed = {r: p.returncode for r, p in replicas.items() if p.returncode != 0}
        if failed:
            print(f"replicas that did not finish (exit status, None: killed at the deadline): {failed}; "
                  f"see {work_dir}", file=sys.stderr)
    finally:
        run.stop()

    records = read_steps(steps_path)
    if newest_step(records) < args.steps:
        print(f"replica 0 stopped at step {newest_step(records)} of {args.steps}", file=sys.stderr)
    first_new = [r for r in records if r["step"] == last_before_kill + 1]
    full_size = [r for r in records if r["step"] > last_before_kill and r["participants"] == args.replicas]
    result = {
        "replicas": args.replicas,
        "kill_to_first_new_step_s": round(first_new[0]["time"] - kill_time, 3) if first_new else None,
        "steps_trained_again": sum(1 for r in records if r["step"] <= last_before_kill and r["time"] > kill_time),
        "kill_to_full_size_s": round(full_size[0]["time"] - kill_time, 3) if full_size else None,
        "last_step_before_kill": last_before_kill,
    }
    print(json.dumps(result))
    return 0 if newest_step(records) >= args.steps and not failed else 1


def main():
    args = parse_args(sys.argv[1:])
    if args.role == "lighthouse":
        run_lighthouse(args)
    elif args.role == "replica":
        run_replica(args)
    else:
        try:
            sys.exit(drive(args))
        except RuntimeError as e:
            sys.exit(f"torchft_recovery: {e}")


if __name__ == "__main__":
    main()
