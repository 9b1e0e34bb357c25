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
* ``span``: the seeds written into shared memory made once, a
  :class:`~pytorch_zerocopy.pipeline.loader.SeedRange` of ints on the queue (the loaders now
  write a whole epoch's seeds at its start and send a range per group of minibatches);
* ``int``: a slot number, what the loop sends back per minibatch (the ring's free queue);
* ``span_direct``: a span on the queue the loaders now use for what the loop sends,
  :func:`~pytorch_zerocopy.pipeline.runner.direct_queue` (its ``put`` writes to the pipe in the
  calling thread; the others use ``multiprocessing``'s ``Queue``, whose feeder thread needs the
  sender's GIL).

Then what the puts cost the sender: a step of fixed work (Python and small torch ops, the shape
of a model step's host side), ``--cost-steps`` times, with no put, and with the two puts a loop
makes per minibatch (a span and a slot number) on a ``Queue`` and on a direct queue, a
receiver draining them: ms per step, and per put over the step without.

CPU only; it times nothing on a GPU and no bar of an issue reads it. Its ``"bars"``: the mean
lags (``loader_seed_lag_ms``: the ``span_direct`` way, what the loaders send;
``queue_span_lag_ms``, ``tensor_seed_lag_ms``, ``seed_batch_lag_ms``, ``int_lag_ms``),
``tensor_over_loader``, and the sender's cost of a put (``queue_put_cost_ms``,
``direct_put_cost_ms``).

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
from pytorch_zerocopy.datasets.base import shared_host_tensor  # noqa: E402
from pytorch_zerocopy.pipeline.loader import SeedBuffer, SeedRange  # noqa: E402
from pytorch_zerocopy.pipeline.minibatches import SeedBatch  # noqa: E402
from pytorch_zerocopy.pipeline.plan import Phase  # noqa: E402

from pytorch_zerocopy.pipeline.runner import direct_queue  # noqa: E402

WAYS = ("tensor", "seed_batch", "span", "int", "span_direct")
COST_KINDS = ("none", "queue", "direct")


def _receive(q, back, n: int) -> None:
    while q.get() != "start":  # what comes before the timed puts (the span way's rows)
        pass
    back.put([(q.get(), time.monotonic())[1] for _ in range(n)])


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def _item(way: str, i: int, seeds: torch.Tensor, shared: torch.Tensor):
    if way in ("span", "span_direct"):
        shared.copy_(seeds + i)  # the receiver reads it at once here; a loader waits for the delivery
        return SeedRange(0, i, i + 1)
    if way == "tensor":
        return seeds + i
    if way == "seed_batch":
        return SeedBatch(Phase.TRAIN, 0, i, seeds + i)
    return i


def measure(way: str, batches: int, step_ms: float, batch_size: int) -> Dict:
    ctx = mp.get_context("spawn")
    q, back = (direct_queue(ctx) if way == "span_direct" else ctx.Queue()), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(q, back, batches))
    receiver.start()
    seeds = torch.randint(0, 1 << 25, (batch_size,))
    shared = shared_host_tensor((batch_size,), torch.int64)
    if way in ("span", "span_direct"):
        q.put(SeedBuffer(shared))  # the buffer made and sent before the timed puts
    q.put("start")
    time.sleep(3.0)  # the receiver has started and waits
    put_at: List[float] = []
    for i in range(batches):
        _busy(step_ms)
        q.put(_item(way, i, seeds, shared))
        put_at.append(time.monotonic())
    arrived = back.get()
    receiver.join()
    lags = [a - p for a, p in zip(arrived, put_at)]
    return {"way": way, "batches": batches, "mean_lag_ms": statistics.mean(lags) * 1e3,
            "max_lag_ms": max(lags) * 1e3, "last_after_last_put_ms": (arrived[-1] - put_at[-1]) * 1e3,
            "lag_first_quarter_ms": statistics.mean(lags[:batches // 4]) * 1e3,
            "lag_last_quarter_ms": statistics.mean(lags[-(batches // 4):]) * 1e3}


def _drain(q, n: int) -> None:
    for _ in range(n):
        q.get()


def _step(ops: int, t: torch.Tensor) -> None:
    for _ in range(ops):
        t.add_(1)


def sender_cost(kind: str, steps: int, ops: int) -> float:
    """ms per fixed-work step of ``ops`` small torch ops, with two puts per step on a ``kind``
    queue (none: no puts), a spawned receiver draining them."""
    ctx = mp.get_context("spawn")
    q = None if kind == "none" else (direct_queue(ctx) if kind == "direct" else ctx.Queue())
    receiver = None
    if q is not None:
        receiver = ctx.Process(target=_drain, args=(q, 2 * steps + 1))
        receiver.start()
        q.put("start")
    time.sleep(2.0)
    t = torch.zeros(64)
    start = time.perf_counter()
    for i in range(steps):
        if q is not None:
            q.put(SeedRange(0, i, i + 1))
            q.put(i % 16)
        _step(ops, t)
    took = time.perf_counter() - start
    if receiver is not None:
        receiver.join()
        q.close()
    return took / steps * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=3.0, help="the loop's Python step between puts")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (int64)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default="seed_queue_cpu")
    p.add_argument("--cost-steps", type=int, default=200, help="steps per sender-cost run")
    p.add_argument("--cost-ops", type=int, default=600, help="small torch ops per sender-cost step")
    p.add_argument("--cost-repeats", type=int, default=3, help="sender-cost runs per kind, interleaved (median)")
    args = p.parse_args(argv)
    rows = [measure(way, args.batches, args.step_ms, args.batch_size) for way in WAYS]
    for r in rows:
        print(f"{r['way']:>10}: mean lag {r['mean_lag_ms']:7.1f} ms (first quarter {r['lag_first_quarter_ms']:.1f}, "
              f"last {r['lag_last_quarter_ms']:.1f}), last batch {r['last_after_last_put_ms']:.1f} ms after the "
              "last put", flush=True)
    runs: Dict[str, List[float]] = {k: [] for k in COST_KINDS}
    for _ in range(args.cost_repeats):
        for kind in COST_KINDS:
            runs[kind].append(sender_cost(kind, args.cost_steps, args.cost_ops))
    step = {k: statistics.median(v) for k, v in runs.items()}
    cost = {"ms_per_step": step, "runs_ms_per_step": runs,
            "put_cost_ms": {k: (step[k] - step["none"]) / 2 for k in ("queue", "direct")}}
    print(f"sender: ms per step {step}; per put over none {cost['put_cost_ms']}", flush=True)
    lag = {r["way"]: r["mean_lag_ms"] for r in rows}
    bars = {"loader_seed_lag_ms": lag["span_direct"], "queue_span_lag_ms": lag["span"],
            "tensor_seed_lag_ms": lag["tensor"], "seed_batch_lag_ms": lag["seed_batch"], "int_lag_ms": lag["int"],
            "tensor_over_loader": lag["tensor"] / lag["span_direct"] if lag["span_direct"] > 0 else None,
            "queue_put_cost_ms": cost["put_cost_ms"]["queue"], "direct_put_cost_ms": cost["put_cost_ms"]["direct"]}
    result = {"environment": environment(), "args": vars(args), "rows": rows, "sender_cost": cost, "bars": bars}
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
    lines += ["", f"What the puts cost the sender: a step of {args.cost_ops} small torch ops, {args.cost_steps} steps, "
              f"two puts per step (a span and a slot number), median of {args.cost_repeats} interleaved runs:", "",
              "| queue | ms per step (runs) | per put over no puts, ms |", "|---|---:|---:|"]
    lines += [f"| {k} | {step[k]:.3f} ({', '.join(f'{x:.3f}' for x in runs[k])}) | "
              f"{cost['put_cost_ms'][k]:.3f} |" if k != "none" else
              f"| no puts | {step[k]:.3f} ({', '.join(f'{x:.3f}' for x in runs[k])}) | – |" for k in COST_KINDS]
    lines += ["", "| bar | value |", "|---|---|"] + [f"| {k} | {'n/a' if v is None else f'{v:.3f}'} |"
                                                    for k, v in bars.items()]
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}/{args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
