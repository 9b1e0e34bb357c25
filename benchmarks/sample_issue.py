"""Host cost of issuing GPU samples, and how it holds up with several samplers in one process
(diagnostic: the machine's gatherer serves every trainer of a machine from one process).

One GPU. For 1, 2 and 4 samplers, each a :class:`~pytorch_zerocopy.pipeline.minibatches.GpuSampler`
on its own stream, run as threads of this process and as separate processes, every sampler
draws ``--batches`` minibatches of the training run (batch 1024, fanouts 15,10 by default) from
a papers-like graph mapped in host memory. Reported: minibatches per second of all samplers
together, and each sampler's host time to issue and pack a sample (the wait for its sizes left
out). A ``torch.profiler`` table of one sampler's host work follows. Results:
``sample_issue.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sampler(ds, plan, device):
    from pytorch_zerocopy.pipeline.minibatches import GpuSampler
    from pytorch_zerocopy.pipeline.trace import ProducerTrace

    return GpuSampler(plan, ds, device, ahead=plan.gather_batches, trace=ProducerTrace(True))


def _drain(sampler, out: Dict[str, Any], start: threading.Barrier) -> None:
    from pytorch_zerocopy.pipeline.minibatches import Sampled

    issued: List[float] = []
    start.wait()
    t = time.perf_counter()
    for item in sampler:
        if isinstance(item, Sampled):
            issued.append(item.issued * 1e3)
    torch.cuda.synchronize()
    out["seconds"] = time.perf_counter() - t
    out["issued_ms"] = issued


def _summary(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    n = sum(len(r["issued_ms"]) for r in runs)
    wall = max(r["seconds"] for r in runs)
    every = [x for r in runs for x in r["issued_ms"][5:]]
    return {"minibatches": n, "seconds": wall, "minibatches_per_s": n / wall,
            "issue_ms_p50": statistics.median(every), "issue_ms_p90": sorted(every)[int(0.9 * len(every))]}


def threads_run(ds, plan, device, count: int) -> Dict[str, Any]:
    samplers = [_sampler(ds, plan, device) for _ in range(count)]
    outs: List[Dict[str, Any]] = [{} for _ in range(count)]
    barrier = threading.Barrier(count)
    threads = [threading.Thread(target=_drain, args=(s, o, barrier)) for s, o in zip(samplers, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summary(outs)


def _process_entry(args, conn) -> None:
    ds, plan, device = _setup(args)
    out: Dict[str, Any] = {}
    sampler = _sampler(ds, plan, device)
    conn.send("ready")
    conn.recv()
    _drain(sampler, out, threading.Barrier(1))
    conn.send(out)


def processes_run(args, count: int) -> Dict[str, Any]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(count):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_process_entry, args=(args, b))  # not daemonic: papers_like starts children
        p.start()
        pipes.append(a)
        procs.append(p)
    try:
        for a in pipes:
            if not a.poll(300):
                raise TimeoutError("a sampler process did not get ready within 300 s")
            assert a.recv() == "ready"
        for a in pipes:
            a.send("go")
        outs = [a.recv() for a in pipes]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return _summary(outs)


def _setup(args):
    from pytorch_zerocopy.datasets import papers_like
    from pytorch_zerocopy.pipeline.plan import Plan, SampleOn

    ds = papers_like(args.nodes, avg_degree=args.degree, feature_dim=8, train_fraction=0.05, seed=args.seed)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    # The default plan's sampling: on the GPU, the lists mapped in host memory, two samples ahead.
    plan = Plan(device="cuda:0", sample_on=SampleOn.GPU, fanouts=fanouts, batch_size=args.batch_size,
                max_batches=args.batches, epochs=1, val_batches=1, trace=True, gather_batches=2, num_slots=4,
                num_samplers=0)
    return ds, plan, torch.device("cuda", 0)


def bars_of(result: Dict[str, Any]) -> Dict[str, float]:
    """The diagnostic's figures: one sampler's host time to issue a sample (p50, ms), and the
    rate of the most samplers over one's, as threads of one process and as processes."""
    threads, processes = result["threads"], result["processes"]
    one, most = min(threads, key=int), max(threads, key=int)
    def rate(way: Dict[str, Any], count) -> float:
        return way[count]["minibatches_per_s"]

    return {"issue_ms_p50_one_sampler": threads[one]["issue_ms_p50"],
            f"threads_{most}_over_1_rate": rate(threads, most) / rate(threads, one),
            f"processes_{most}_over_1_rate": rate(processes, most) / rate(processes, one)}


def profile_table(ds, plan, device, rows: int = 30) -> str:
    from torch.profiler import ProfilerActivity, profile

    sampler = _sampler(ds, plan, device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _drain(sampler, {}, threading.Barrier(1))
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--nodes", type=int, default=1 << 23)
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--batches", type=int, default=300, help="minibatches per sampler")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--counts", default="1,2,4")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("sample_issue.py needs a GPU")
        return 2
    ds, plan, device = _setup(args)
    result: Dict[str, Any] = {"config": vars(args), "gpu": torch.cuda.get_device_name(0), "threads": {},
                              "processes": {}}
    threads_run(ds, plan, device, 1)  # warm-up: the graph's pages, the op's first launches
    for count in [int(c) for c in args.counts.split(",")]:
        result["threads"][count] = threads_run(ds, plan, device, count)
        print(f"{count} sampler thread(s): {result['threads'][count]}", flush=True)
        result["processes"][count] = processes_run(args, count)
        print(f"{count} sampler process(es): {result['processes'][count]}", flush=True)
    result["bars"] = bars_of(result)
    table = profile_table(ds, plan, device)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sample_issue.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Host cost of issuing GPU samples ({result['gpu']})", "",
             f"Graph: {ds.describe()}; batch {args.batch_size}, fanouts {args.fanouts}; {args.batches} minibatches "
             "per sampler, every one sampled.", "",
             "| samplers | as | minibatches/s (all) | issue ms p50 | issue ms p90 |", "|---|---|---|---|---|"]
    for way in ("threads", "processes"):
        for count, s in result[way].items():
            lines.append(f"| {count} | {way} | {s['minibatches_per_s']:.0f} | {s['issue_ms_p50']:.3f} | "
                         f"{s['issue_ms_p90']:.3f} |")
    lines += ["", "One sampler's host work (torch.profiler, self CPU time):", "", "```", table, "```"]
    with open(os.path.join(args.out, "sample_issue.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
