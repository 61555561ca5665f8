#!/usr/bin/env python3
"""Prints the scalars TensorBoard reads from a log directory, as one JSON line: {tag: [[step, value], ...]}.

The tests use TensorBoard's own reader (EventAccumulator, which drops the events a SessionLog START purges) so
that tandem's event files are judged by what TensorBoard shows, not by a second parser of ours.
Usage: read_tensorboard.py LOG_DIR
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_tensorboard.py LOG_DIR")
    log_dir = sys.argv[1]
    if not os.path.isdir(log_dir):
        sys.exit(f"read_tensorboard.py: {log_dir} is not a directory")
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as error:
        sys.exit(f"read_tensorboard.py: cannot import tensorboard ({error}): run scripts/install-python-tools")

    # SCALARS: 0 keeps every event rather than a reservoir sample.
    accumulator = event_accumulator.EventAccumulator(log_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    scalars = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    print(json.dumps(scalars, sort_keys=True))


if __name__ == "__main__":
    main()
