"""Data-parallel GraphSAGE: one training pipeline per GPU, one shared host copy of the dataset,
gradients averaged every step. Two ways to run the same thing:

    zerocopy train --gpus 2                          # the command line
    python examples/multi_gpu.py --gpus 2            # the Python API, train_data_parallel

    python examples/multi_gpu.py --max-batches 2 --epochs 1   # seconds on any machine
    python examples/multi_gpu.py --cli               # prints and runs the equivalent command

Without a GPU the workers run on the CPU and average gradients over gloo (default: 2 workers);
with GPUs, one worker per GPU (default: all of them) over NCCL.
"""

import argparse
import shlex
import subprocess
import sys
import time

import torch

from pytorch_zerocopy.datasets import load_dataset
from pytorch_zerocopy.train import train_data_parallel


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    p.add_argument("--gpus", type=int, default=gpus or 2, help="workers: one per GPU (CPU workers without a GPU)")
    p.add_argument("--dataset", default="community", help="'community' or 'papers-like:NODES' (see zerocopy train)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--max-batches", type=int, default=None, help="training minibatches per epoch (default: all)")
    p.add_argument("--cli", action="store_true", help="run `zerocopy train --gpus N` instead of the Python API")
    args = p.parse_args(argv)

    if args.cli:
        cmd = ["zerocopy", "train", "--gpus", str(args.gpus), "--dataset", args.dataset, "--epochs", str(args.epochs),
               "--batch-size", str(args.batch_size), "--fanouts", args.fanouts]
        if args.max_batches is not None:
            cmd += ["--max-batches", str(args.max_batches)]
        print("$ " + shlex.join(cmd), flush=True)
        rc = subprocess.run([sys.executable, "-m", "pytorch_zerocopy"] + cmd[1:]).returncode
        if rc:
            raise SystemExit(rc)
        return {}

    dataset = load_dataset(args.dataset)  # in shared memory: every worker maps the same bytes
    print(f"dataset {dataset.describe()}")
    print(f"{args.gpus} {'GPU' if gpus else 'CPU (gloo)'} workers; same run: zerocopy train --gpus {args.gpus}")
    start = time.perf_counter()
    results = train_data_parallel(dataset, args.gpus, "zerocopy", fanouts=[int(f) for f in args.fanouts.split(",")],
                                  batch_size=args.batch_size, epochs=args.epochs, max_batches=args.max_batches,
                                  use_gpu=None if gpus else False, quiet=True)
    for epoch, stats in enumerate(results[0]):
        print(f"rank 0, epoch {epoch}: {stats.train_seconds:.2f} s, {stats.train_batches} minibatches, "
              f"loss {stats.loss:.4f}, val acc {stats.val_acc:.4f}")
    print(f"{len(results)} workers finished in {time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    main()
