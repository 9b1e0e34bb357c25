"""Unified tensors: the PyTorch-Direct paper's Listing 1 (GPU reads host memory in place) and
Listing 3 (one shared host table mapped by several processes, each on its own GPU).

    python examples/unified_tensor.py                 # 64 Mi floats (256 MiB)
    python examples/unified_tensor.py --size 100000   # seconds on any machine

With a GPU the additions run on it, reading the unified tensor over PCIe; without one the same
code runs on the CPU (a unified tensor is then a shared host tensor). The script also times
copying the tensor into GPU memory against reading it in place once.
"""

import argparse
import time

import torch
import torch.multiprocessing as mp

import pytorch_zerocopy  # noqa: F401  registers the unified device


def listing_1(size: int) -> None:
    gpu = "cuda" if torch.cuda.is_available() else "cpu"
    input_tensor = torch.randn([size], device="cpu")           # data in host memory
    gpu_tensor = input_tensor.to(device=gpu)                   # copied by DMA into GPU memory
    unified_tensor = input_tensor.to(device="unified")         # mapped in place: no copy
    output = gpu_tensor + unified_tensor                       # the GPU reads host memory
    assert torch.equal(output.cpu(), 2 * input_tensor)
    assert unified_tensor.cpu().data_ptr() == input_tensor.data_ptr(), "unified must alias the host tensor"
    print(f"Listing 1: {size:,} floats, output on {output.device}, unified tensor on {unified_tensor.device} "
          f"(shares the host tensor's memory)")

    if gpu == "cpu":
        print("  (no GPU here: both timings below run on the CPU)")
    sync = torch.cuda.synchronize if gpu == "cuda" else (lambda: None)
    for what, make in (("copy to GPU memory, then sum", lambda: input_tensor.to(gpu).sum()),
                       ("sum read in place (unified)", lambda: unified_tensor.sum())):
        make()
        sync()
        start = time.perf_counter()
        for _ in range(3):
            make()
        sync()
        ms = (time.perf_counter() - start) / 3 * 1e3
        print(f"  {what:<30} {ms:8.2f} ms  ({size * 4 / ms / 1e6:6.1f} GB/s)")


def producer(features: torch.Tensor, process_id: int, num_processes: int) -> None:
    # Listing 3, lines 4-9: pick this process's GPU, then map the shared host memory for it.
    if torch.cuda.is_available():
        torch.cuda.set_device(process_id % torch.cuda.device_count())
    features = features.to(device="unified")
    rows = features.shape[0] // num_processes
    mine = features[process_id * rows:(process_id + 1) * rows]  # a view: still unified
    mine.add_(process_id + 1)                                    # in place: writes host memory
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def listing_3(size: int, num_processes: int) -> None:
    features = torch.randn([size], device="cpu")
    features = features.share_memory_()                          # shared memory, before mapping
    before = features.clone()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=producer, args=(features, i, num_processes)) for i in range(num_processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"producer failed with exit code {p.exitcode}")
    rows = size // num_processes
    for i in range(num_processes):
        assert torch.equal(features[i * rows:(i + 1) * rows], before[i * rows:(i + 1) * rows] + (i + 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = f"{min(gpus, num_processes)} GPU(s)" if gpus else "the CPU"
    print(f"Listing 3: {num_processes} processes on {where} wrote their slices of one shared table "
          "in place; the parent sees every write")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=64 << 20, help="floats in the tensors")
    p.add_argument("--processes", type=int, default=2, help="producer processes in Listing 3")
    args = p.parse_args(argv)
    listing_1(args.size)
    listing_3(args.size, args.processes)


if __name__ == "__main__":
    main()
