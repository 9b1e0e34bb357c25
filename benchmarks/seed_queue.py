"""Diagnostic: how late a loader's seed batches reach its sampling role while the training loop
runs Python, by how they travel.

The process way (``pipeline=True``) sends each minibatch's seeds from the training loop's
process to the sampling role on a ``multiprocessing`` queue (:class:`SeedBatch`). Here the
loop is a busy pure-Python step of ``--step-ms`` (the GIL held, as a model step written in
Python holds it between the calls that release it), then one put; a spawned receiver takes
the batches and stamps each arrival. Per way: the mean lag of an arrival behind its put, and
how long after the last put the last batch arrived (a lag that grows batch after batch is a
receiver that cannot keep up: a sampling role starved of seeds). Ways:

* ``tensor``: the seeds as a bare tensor (torch's reduction: a shared-memory handle whose
  receiver connects back to the sender's process, to a thread that needs the sender's GIL);
* ``seed_batch``: a :class:`SeedBatch`, its seeds by value;
* ``span``: what the loaders send: the seeds written into a row of shared memory made once,
  a :class:`~pytorch_zerocopy.pipeline.loader.SeedSpan` of ints on the queue;
* ``int``: a slot number, what the loop sends back per minibatch (the ring's free queue).

CPU only; it times nothing on a GPU and no bar of an issue reads it. Its ``"bars"``: the mean
lags (``loader_seed_lag_ms``: the ``span`` way, what the loaders send; ``tensor_seed_lag_ms``,
``seed_batch_lag_ms``, ``int_lag_ms``) and ``loader_seed_lag_over_int``, ``tensor_over_loader``.

    python benchmarks/seed_queue.py            # a few seconds

Writes seed_queue_cpu.json and .md under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import environment  # noqa: E402
from pytorch_zerocopy.pipeline.loader import SeedSpan, _SeedRows  # noqa: E402
from pytorch_zerocopy.pipeline.minibatches import SeedBatch  # noqa: E402
from pytorch_zerocopy.pipeline.plan import Phase  # noqa: E402

WAYS = ("tensor", "seed_batch", "span", "int")


def _receive(q, back, n: int) -> None:
    while q.get() != "start":  # what comes before the timed puts (the span way's rows)
        pass
    back.put([(q.get(), time.monotonic())[1] for _ in range(n)])


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def _item(way: str, i: int, seeds: torch.Tensor, rows: _SeedRows, queue):
    if way == "span":
        row = rows.put(seeds + i, [queue])
        rows.release(row)  # the receiver reads it at once here; a loader waits for the delivery
        return SeedSpan(0, i, row, seeds.numel(), None)
    if way == "tensor":
        return seeds + i
    if way == "seed_batch":
        return SeedBatch(Phase.TRAIN, 0, i, seeds + i)
    return i


def measure(way: str, batches: int, step_ms: float, batch_size: int) -> Dict:
    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(q, back, batches))
    receiver.start()
    seeds = torch.randint(0, 1 << 25, (batch_size,))
    rows = _SeedRows(1, batch_size)
    if way == "span":
        rows.release(rows.put(seeds, [q]))  # the rows made and sent before the timed puts
    q.put("start")
    time.sleep(3.0)  # the receiver has started and waits
    put_at: List[float] = []
    for i in range(batches):
        _busy(step_ms)
        q.put(_item(way, i, seeds, rows, q))
        put_at.append(time.monotonic())
    arrived = back.get()
    receiver.join()
    lags = [a - p for a, p in zip(arrived, put_at)]
    return {"way": way, "batches": batches, "mean_lag_ms": statistics.mean(lags) * 1e3,
            "max_lag_ms": max(lags) * 1e3, "last_after_last_put_ms": (arrived[-1] - put_at[-1]) * 1e3,
            "lag_first_quarter_ms": statistics.mean(lags[:batches // 4]) * 1e3,
            "lag_last_quarter_ms": statistics.mean(lags[-(batches // 4):]) * 1e3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=3.0, help="the loop's Python step between puts")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (int64)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default="seed_queue_cpu")
    args = p.parse_args(argv)
    rows = [measure(way, args.batches, args.step_ms, args.batch_size) for way in WAYS]
    for r in rows:
        print(f"{r['way']:>10}: mean lag {r['mean_lag_ms']:7.1f} ms (first quarter {r['lag_first_quarter_ms']:.1f}, "
              f"last {r['lag_last_quarter_ms']:.1f}), last batch {r['last_after_last_put_ms']:.1f} ms after the "
              "last put", flush=True)
    lag = {r["way"]: r["mean_lag_ms"] for r in rows}
    bars = {"loader_seed_lag_ms": lag["span"], "tensor_seed_lag_ms": lag["tensor"],
            "seed_batch_lag_ms": lag["seed_batch"], "int_lag_ms": lag["int"],
            "loader_seed_lag_over_int": lag["span"] / lag["int"], "tensor_over_loader": lag["tensor"] / lag["span"]}
    result = {"environment": environment(), "args": vars(args), "rows": rows, "bars": bars}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    env = result["environment"]
    lines = ["# Seed batches on a queue while the loop runs Python (diagnostic)", "",
             f"{env['date']} · {env.get('cpu_model') or 'CPU'} · {env['cpus']} CPUs · torch {env['torch']}", "",
             f"{args.batches} batches of {args.batch_size} int64 seeds, one put after each {args.step_ms:g} ms "
             "pure-Python step; lag = arrival in the receiver minus the put.", "",
             "| way | mean lag ms | first quarter | last quarter | max | last batch after the last put ms |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['way']} | {r['mean_lag_ms']:.1f} | {r['lag_first_quarter_ms']:.1f} | "
              f"{r['lag_last_quarter_ms']:.1f} | {r['max_lag_ms']:.1f} | {r['last_after_last_put_ms']:.1f} |"
              for r in rows]
    lines += ["", "| bar | value |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in bars.items()]
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}/{args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
