"""GraphSAGE training time per data path (the paper's Figure 11), every minibatch freshly sampled.

    python benchmarks/training.py            # GPU: 16 GiB table, dma / zerocopy / gpu + producer placement
    python benchmarks/training.py --quick    # CPU, seconds: the CPU pipeline on a small table
    python benchmarks/training.py --gpus 1,2 # data-parallel scaling per mode (training_gpus.*)

One papers100M-like graph (``papers_like``, 2^25 nodes, ~503 M edges) whose float32 feature
table holds ``--table-gib`` GiB of host memory; batch 1024, fanouts 15,10. Every run samples
every minibatch as a user's run does (``--replay N`` replays N pre-sampled minibatches instead:
a diagnostic that leaves sampling out, labelled as such in every output). Each mode trains
``--epochs`` epochs of ``--max-batches`` minibatches; the last epoch is timed at its steady-state
rate (its first minibatch, which carries the pipeline's fill, left out).

Per run and minibatch: time (ms), and where it goes: sample (the GPU sampler's time from issue
to blocks ready, or a CPU sampler's host time), gather (GPU time of the producer's gather, or
the CPU gather's host time), train (GPU time of the training step); the GPU busy share (train
time / epoch time); the unique input rows and the link-bound floor (rows x row bytes / the
pinned memcpy rate measured in this run). Placement rows, for the choice of where sampling and
gathering run: ``zerocopy`` under MPS at other producer shares (``--shares``), unpartitioned
(``--extra-partitions``), and inside the trainer's process with no producer (``--in-trainer``); ``--width-sweep`` adds Figure 12 (table size
fixed, feature width varied). Cache row: ``zerocopy`` with a GPU cache of ``--cache-fraction``
of the table's rows (``--cache-policy``; ``zerocopy[cache 10%]``), chosen before the run, with
the share of input rows it held; the bar ``zerocopy_cache10_over_gpu_epoch_time`` sets it
against the table held in GPU memory (the fastest of the cache rows). Managed rows: ``zerocopy[managed]``
and the cache row again with the uncached rows read from the producer's copy of the table in
managed memory kept in host memory (``host_memory='managed'``; ``--no-managed`` leaves them
out); ``--cache-shares`` runs the cache row again under MPS at those producer shares (from
managed memory unless ``--no-managed``). The table in GPU memory runs twice, first and last
(``gpu[again]``); ratios to ``gpu`` use the faster of the two. Results: ``training.{json,md,png}``
(``training_quick`` with ``--quick``), with the bars of the issue in ``"bars"``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.pipeline_common import header_lines, machine_info, measure_ceilings, trace_lines, write_report  # noqa: E402

GPU_MODES = "dma,zerocopy,gpu"
CPU_MODES = "zerocopy,cpu"
BAR_MS = 2.5  # zerocopy ms per minibatch
BAR_OVER_DMA = 3.0
BAR_CACHE_OVER_GPU = 1.10  # zerocopy with a cache of 10% of the table, against the table in GPU memory
MANAGED_LABEL = "zerocopy[managed]"  # uncached rows read from a managed copy of the table kept in host memory
GPU_REPEAT_LABEL = "gpu[again]"  # the table in GPU memory, run again after the others


def _mean(summary: Optional[Dict[str, float]]) -> float:
    return summary["mean"] if summary and summary.get("n") else float("nan")


def _p50(summary: Optional[Dict[str, float]]) -> float:
    return summary["p50"] if summary and summary.get("n") else float("nan")


def _run(ds, label: str, mode: str, args, max_batches: int, ceiling_gbs: float, **settings) -> Dict:
    """One training run; the row of its last (timed) epoch."""
    from pytorch_zerocopy.train import train

    settings.setdefault("partition", args.partition if mode == "zerocopy" else "auto")
    if mode == "zerocopy":
        settings.setdefault("producer_share", args.producer_share)
    from pytorch_zerocopy.pipeline.plan import gpu_available

    cpu_sampling = mode in ("dma", "cpu") or settings.get("sample_on") == "cpu" or not gpu_available()
    if args.samplers is not None and cpu_sampling:
        settings.setdefault("num_samplers", args.samplers)
    start = time.perf_counter()
    epochs = train(ds, mode=mode, fanouts=[int(f) for f in args.fanouts.split(",")], batch_size=args.batch_size,
                   epochs=args.epochs, max_batches=max_batches, val_batches=1, hidden=args.hidden, quiet=True,
                   replay=args.replay, trace=True, cuda_graph=None if not args.eager else False, **settings)
    wall = time.perf_counter() - start
    last = epochs[-1]
    ms = last.steady_ms_per_minibatch
    batches = last.steady_batches if last.steady_batches >= 1 else last.train_batches
    nbytes = last.steady_bytes if last.steady_batches >= 1 else last.feature_bytes
    seconds = ms * batches / 1e3
    rows = nbytes / max(1, batches) / ds.row_bytes
    trace = last.trace
    producer, consumer = trace.producer, trace.consumer
    gpu = "gpu_train_ms" in trace.per_step
    train_key = "gpu_train_ms" if gpu else "issue_ms"  # a CPU step runs while the host issues it
    train_ms = trace.per_step.get(train_key, [])
    floor_ms = rows * ds.row_bytes / (ceiling_gbs * 1e9) * 1e3 if ceiling_gbs == ceiling_gbs else float("nan")
    return {"mode": label, "base_mode": mode, "settings": {k: v for k, v in settings.items()},
            "ms_per_minibatch": ms, "epoch_seconds": ms * last.train_batches / 1e3,
            "minibatches": last.train_batches, "measured_epoch_seconds": last.train_seconds,
            "sample_ms": _mean(producer.get("sample_ms")), "sample_ms_p50": _p50(producer.get("sample_ms")),
            "gather_ms": _mean(producer.get("gather_ms")), "gather_ms_p50": _p50(producer.get("gather_ms")),
            "train_ms": statistics.fmean(train_ms) if train_ms else float("nan"),
            "train_ms_p50": _p50(consumer.get(train_key)),
            "gpu_busy_share": sum(train_ms) / (seconds * 1e3) if gpu and seconds > 0 else float("nan"),
            "input_wait_share": last.input_wait_share,
            "input_rows": rows, "link_floor_ms": floor_ms, "over_link_floor": ms / floor_ms if floor_ms else float("nan"),
            "feature_gbs": nbytes / seconds / 1e9 if seconds > 0 else float("nan"),
            "val_acc": last.val_acc, "loss": last.loss, "wall_seconds": wall,
            "cache_rows": last.cache_rows, "cache_hit_rate": last.cache_hit_rate,
            "partition": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(last.partition).items()
                          if v is not None},
            "gather_batches": last.gather_batches, "train_step": last.train_step, "trace": asdict(trace)}


def _dataset(table_gib, width, args):
    from pytorch_zerocopy.datasets import papers_like

    nodes = max(10_000, int(table_gib * 2**30 // (width * 4)))
    t = time.perf_counter()
    ds = papers_like(nodes, avg_degree=args.degree, feature_dim=width, train_fraction=0.01)
    gen_s = time.perf_counter() - t
    print(f"  {ds.describe()} generated in {gen_s:.1f} s", flush=True)
    return ds, gen_s


def _line(r: Dict) -> str:
    if "error" in r:
        return f"  {r['mode']}: FAILED {r['error']}"
    return (f"  {r['mode']}: {r['ms_per_minibatch']:.2f} ms/minibatch (sample {r['sample_ms']:.2f}, gather "
            f"{r['gather_ms']:.2f}, train {r['train_ms']:.2f}; floor {r['link_floor_ms']:.2f}), GPU busy "
            f"{r['gpu_busy_share']:.0%}, {r['feature_gbs']:.1f} GB/s, {r['wall_seconds']:.0f} s"
            + (f", cache of {r['cache_rows']:,} rows held {r['cache_hit_rate']:.0%} of the input rows"
               if r.get("cache_rows") else ""))


def _table(runs: List[Dict], by: Dict[str, Dict], ceiling: float) -> List[str]:
    lines = ["| run | ms / minibatch | sample ms | gather ms | train ms | GPU busy | input wait | input rows | "
             "link floor ms | x floor | feature GB/s | x memcpy | vs dma | vs gpu | val acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['mode']} | failed: {r['error']} |" + " |" * 14)
            continue
        vs_dma = f"{by['dma']['ms_per_minibatch'] / r['ms_per_minibatch']:.2f}x faster" if "dma" in by else "-"
        vs_gpu = f"{r['ms_per_minibatch'] / by['gpu']['ms_per_minibatch']:.2f}x time" if "gpu" in by else "-"
        lines.append(
            f"| {r['mode']} | {r['ms_per_minibatch']:.2f} | {r['sample_ms']:.2f} | {r['gather_ms']:.2f} | "
            f"{r['train_ms']:.2f} | {r['gpu_busy_share']:.0%} | {r['input_wait_share']:.0%} | {r['input_rows']:,.0f} | "
            f"{r['link_floor_ms']:.2f} | {r['over_link_floor']:.2f} | {r['feature_gbs']:.1f} | "
            f"{r['feature_gbs'] / ceiling:.2f} | {vs_dma} | {vs_gpu} | {r['val_acc']:.3f} |")
    return lines


def _attempt(fn, label):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report and go on with the other runs
        return {"mode": label, "error": str(e).strip().splitlines()[-1][:500]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU, seconds: the CPU pipeline on a small table")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--name", default=None, help="base name of the result files (default training[_quick|_gpus])")
    p.add_argument("--table-gib", type=float, default=None, help="feature table size (default 16; quick 0.1)")
    p.add_argument("--width", type=int, default=128, help="feature width (float32)")
    p.add_argument("--modes", default=None, help=f"modes (default {GPU_MODES}; quick {CPU_MODES})")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the last is timed")
    p.add_argument("--max-batches", type=int, default=None, help="minibatches per epoch (default 100; quick 6)")
    p.add_argument("--replay", type=int, default=None,
                   help="DIAGNOSTIC: replay this many pre-sampled minibatches instead of sampling every one")
    p.add_argument("--samplers", type=int, default=None, help="CPU sampler processes (default: the plan's)")
    p.add_argument("--batch-size", type=int, default=None, help="seeds per minibatch (default 1024; quick 256)")
    p.add_argument("--fanouts", default=None, help="default 15,10; quick 10,5")
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--hidden", type=int, default=None, help="default 256; quick 64")
    p.add_argument("--partition", default="auto", help="zerocopy's partition: auto, mps, green, none")
    p.add_argument("--producer-share", type=float, default=10.0, help="MPS share of the main zerocopy run")
    p.add_argument("--shares", default="5,20,30",
                   help="placement rows: zerocopy under MPS at these producer shares (besides --producer-share)")
    p.add_argument("--extra-partitions", default="none", help="placement rows: zerocopy with these partitions")
    p.add_argument("--in-trainer", action=argparse.BooleanOptionalAction, default=True,
                   help="placement row: zerocopy sampled and gathered inside the trainer's process (no producer)")
    p.add_argument("--cache-fraction", type=float, default=0.10,
                   help="cache row: zerocopy with a GPU cache of this share of the table's rows (0: no cache row)")
    p.add_argument("--cache-policy", default="presample", choices=("presample", "degree"),
                   help="cache row: which rows the cache holds")
    p.add_argument("--managed", action=argparse.BooleanOptionalAction, default=True,
                   help="rows zerocopy[managed] and the cache row with host_memory 'managed' (GPU only)")
    p.add_argument("--cache-shares", default="20,25",
                   help="the cache row again under MPS at these producer shares (e.g. 20,30,50)")
    p.add_argument("--cpu-sampling", action="store_true",
                   help="also run zerocopy with CPU sampler processes (row zerocopy[cpu-sampling])")
    p.add_argument("--width-sweep", default="", help="Figure 12: feature widths at the same table size (e.g. 512,2048)")
    p.add_argument("--eager", action="store_true",
                   help="training steps issued op by op (DDP with several GPUs), not replayed from CUDA graphs")
    p.add_argument("--trace", action="store_true", help="with --gpus: tabulate per-minibatch timings")
    p.add_argument("--repeats", type=int, default=1, help="with --gpus: rounds of every (GPU count, mode)")
    p.add_argument("--producer-sms", type=int, default=16)
    p.add_argument("--gpus", default="1", help="'1': Figure 11 on one GPU; counts such as '1,2': data-parallel scaling")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be a positive count, got {args.repeats}")
    if not 0 <= args.cache_fraction <= 1:
        p.error(f"--cache-fraction must be in [0, 1], got {args.cache_fraction}")
    if args.replay is not None and args.replay < 1:
        p.error(f"--replay must be a positive count, got {args.replay}")
    try:
        gpu_counts = sorted({int(g) for g in str(args.gpus).split(",") if g.strip()})
    except ValueError:
        p.error(f"--gpus must be GPU counts separated by commas, got {args.gpus!r}")
    import torch

    if gpu_counts != [1]:
        args.batch_size, args.fanouts, args.hidden = args.batch_size or 1024, args.fanouts or "15,10", args.hidden or 256
        if not torch.cuda.is_available():
            print("no CUDA GPU: the data-parallel scaling benchmark needs GPUs", file=sys.stderr)
            return 2
        from benchmarks.training_gpus import run_scaling

        args.modes = args.modes or "dma,zerocopy-naive,zerocopy,gpu"
        notes = [f"{args.epochs} epochs per run, the last timed; "
                 + (f"DIAGNOSTIC: replays {args.replay} pre-sampled minibatches" if args.replay
                    else "every minibatch sampled")]
        return run_scaling(args, gpu_counts, _dataset, notes)

    gpu = torch.cuda.is_available()
    q = args.quick or not gpu
    modes = [m for m in (args.modes or (CPU_MODES if q else GPU_MODES)).split(",") if m]
    if not gpu and not set(modes) <= {"cpu", "zerocopy"}:
        print("no CUDA GPU: only --modes cpu,zerocopy run here (the CPU pipeline)", file=sys.stderr)
        return 2
    table_gib = args.table_gib or (0.1 if q else 16.0)
    max_batches = args.max_batches or (6 if q else 100)
    args.batch_size = args.batch_size or (256 if q else 1024)
    args.fanouts = args.fanouts or ("10,5" if q else "15,10")
    args.hidden = args.hidden or (64 if q else 256)
    t_start = time.perf_counter()
    info = machine_info()
    fresh = args.replay is None
    notes = [f"batch {args.batch_size}, fanouts {args.fanouts}, hidden {args.hidden}; {args.epochs} epochs of "
             f"{max_batches} minibatches per run, the last timed at its steady-state rate (its first minibatch left "
             "out)",
             "every minibatch freshly sampled" if fresh else
             f"DIAGNOSTIC RUN: the samplers replay {args.replay} pre-sampled minibatches (sampling not measured)",
             "sample: GPU time from issue to blocks ready (sampling on the GPU, in the process that gathers), or a "
             "CPU sampler process's host time per minibatch (dma, cpu, CPU pipeline); gather: the producer's GPU "
             "time per minibatch (or host time of a CPU gather); train: GPU time of a training step (host time on "
             "the CPU); GPU busy: train time / epoch time",
             "link floor: the minibatch's unique input rows x row bytes / the pinned memcpy rate of this run"]
    print("\n".join(notes), flush=True)

    print(f"table {table_gib:g} GiB, width {args.width}", flush=True)
    ds, gen_s = _dataset(table_gib, args.width, args)
    ceilings = measure_ceilings(ds.features, rows=args.batch_size * 100) if gpu else {}
    ceiling = ceilings.get("pinned_memcpy_gbs", float("nan"))
    print(f"  ceilings: {ceilings}", flush=True)
    runs: List[Dict] = []
    for mode in modes:
        runs.append(_attempt(lambda: _run(ds, mode, mode, args, max_batches, ceiling), mode))
        print(_line(runs[-1]), flush=True)
    extra = []
    if "zerocopy" in modes and gpu and not q:
        extra += [(f"zerocopy[mps {float(s):g}%]", dict(partition="mps", producer_share=float(s)))
                  for s in args.shares.split(",") if s.strip()]
        extra += [(f"zerocopy[{part}]", dict(partition=part)) for part in args.extra_partitions.split(",") if part]
        if args.in_trainer:
            extra.append(("zerocopy[in trainer]", dict(partition="none", gather_in="trainer")))
    if args.cpu_sampling and "zerocopy" in modes:
        extra.append(("zerocopy[cpu-sampling]", dict(sample_on="cpu", num_samplers=args.samplers or 4)))
    cache_label = f"zerocopy[cache {args.cache_fraction * 100:g}%]"
    if args.cache_fraction > 0 and "zerocopy" in modes:
        from pytorch_zerocopy import CacheConfig, CachePolicy

        cache = CacheConfig(policy=CachePolicy(args.cache_policy), fraction=args.cache_fraction)
        extra.append((cache_label, dict(cache=cache)))
        if gpu and args.managed:
            extra.append((MANAGED_LABEL, dict(host_memory="managed")))
            extra.append((cache_label[:-1] + ", managed]", dict(cache=cache, host_memory="managed")))
        if gpu:
            # The cache row at other producer shares, from managed memory where that row runs
            # (the producer's gathers then run as a bounded grid: the plan decides it).
            memory = dict(host_memory="managed") if args.managed else {}
            tag = ", managed" if args.managed else ""
            extra += [(cache_label[:-1] + f"{tag}, mps {float(s):g}%]", dict(cache=cache, partition="mps",
                                                                              producer_share=float(s), **memory))
                      for s in args.cache_shares.split(",") if s.strip()]
    if "gpu" in modes and gpu and not q:
        # The baseline again, last: the bars divide by the faster of its runs.
        extra.append((GPU_REPEAT_LABEL, dict(mode="gpu")))
    for label, settings in extra:
        mode = settings.pop("mode", "zerocopy")
        runs.append(_attempt(lambda: _run(ds, label, mode, args, max_batches, ceiling, **settings), label))
        print(_line(runs[-1]), flush=True)
    described, table_bytes, ds_row_bytes = ds.describe(), ds.features.numel() * ds.features.element_size(), ds.row_bytes
    del ds
    gc.collect()

    sweep = []
    for w in [int(x) for x in args.width_sweep.split(",") if x.strip()]:
        print(f"Figure 12: width {w}, table {table_gib:g} GiB", flush=True)
        wds, _ = _dataset(table_gib, w, args)
        for mode in ("dma", "zerocopy", "gpu") if gpu else ("zerocopy",):
            r = _attempt(lambda: _run(wds, mode, mode, args, max_batches, ceiling), mode)
            r["width"] = w
            print(_line(r), flush=True)
            sweep.append(r)
        del wds
        gc.collect()

    by = {r["mode"]: r for r in runs if "error" not in r}
    baselines = [by[label] for label in ("gpu", GPU_REPEAT_LABEL) if label in by]
    if baselines:
        by["gpu"] = min(baselines, key=lambda r: r["ms_per_minibatch"])
    bars: Dict[str, object] = {"fresh_sampling": fresh}
    zc = by.get("zerocopy")
    if zc is not None:
        bars["zerocopy_ms_per_minibatch"] = zc["ms_per_minibatch"]
        bars[f"zerocopy_at_most_{BAR_MS}ms"] = zc["ms_per_minibatch"] <= BAR_MS
        bars["gpu_busy_share"] = zc["gpu_busy_share"]
        bars["zerocopy_over_link_floor"] = zc["over_link_floor"]
        if "dma" in by:
            bars["zerocopy_speedup_over_dma"] = by["dma"]["ms_per_minibatch"] / zc["ms_per_minibatch"]
            bars[f"zerocopy_at_least_{BAR_OVER_DMA:g}x_dma"] = bars["zerocopy_speedup_over_dma"] >= BAR_OVER_DMA
        if "gpu" in by:
            bars["zerocopy_over_gpu_epoch_time"] = zc["ms_per_minibatch"] / by["gpu"]["ms_per_minibatch"]
    if MANAGED_LABEL in by and "gpu" in by:
        bars["zerocopy_managed_over_gpu_epoch_time"] = by[MANAGED_LABEL]["ms_per_minibatch"] / by["gpu"]["ms_per_minibatch"]
    cache_rows = [r for label, r in by.items() if label.startswith(cache_label[:-1])]
    cached = min(cache_rows, key=lambda r: r["ms_per_minibatch"]) if cache_rows else None
    if cached is not None:
        tag = f"zerocopy_cache{args.cache_fraction * 100:g}"
        bars[f"{tag}_hit_rate"] = cached["cache_hit_rate"]
        if "gpu" in by:
            bars[f"{tag}_over_gpu_epoch_time"] = cached["ms_per_minibatch"] / by["gpu"]["ms_per_minibatch"]
            if args.cache_fraction == 0.10:
                bars[f"{tag}_within_{BAR_CACHE_OVER_GPU:g}x_gpu"] = (bars[f"{tag}_over_gpu_epoch_time"]
                                                                   <= BAR_CACHE_OVER_GPU)
    placement = [r for r in runs if "error" not in r and r["base_mode"] == "zerocopy" and not r.get("cache_rows")]
    best = min(placement, key=lambda r: r["ms_per_minibatch"]) if placement else None
    result = {"machine": info, "notes": notes, "ceilings": ceilings, "dataset": described, "table_bytes": table_bytes,
              "generation_seconds": gen_s, "runs": runs, "width_sweep": sweep,
              "best_zerocopy_placement": best["mode"] if best else None,
              "cache_bar_setting": cached["mode"] if cached is not None else None,
              "gpu_baseline": by["gpu"]["mode"] if "gpu" in by else None, "bars": bars, "config": vars(args),
              "wall_seconds": time.perf_counter() - t_start}

    md = header_lines("GraphSAGE training, every minibatch " + ("sampled" if fresh else "REPLAYED (diagnostic)"),
                      info, ceilings)
    md += ["Notes: " + "; ".join(notes) + ".", "", f"Dataset: {described} (generated in {gen_s:.0f} s)", ""]
    md += _table(runs, by, ceiling)
    if best is not None and len(placement) > 1:
        md += ["", "Producer placement (sampling and gathering in the producer process, on its own streams): "
               + ", ".join(f"{r['mode']} {r['ms_per_minibatch']:.2f} ms" for r in placement)
               + f"; fastest: {best['mode']}."]
    if cached is not None:
        md += ["", f"{cached['mode']}: a cache of {cached['cache_rows']:,} rows "
               f"({cached['cache_rows'] * ds_row_bytes / 2**30:.2f} GiB, {args.cache_policy} policy, chosen before the "
               f"run) held {cached['cache_hit_rate']:.1%} of the training minibatches' input rows."]
    if sweep:
        md += ["", "Figure 12 (same table size, other widths):", ""] + _table(sweep, {}, ceiling)
    md += ["", "Per-minibatch timings (trainer and producer):", ""]
    md += trace_lines([(r["mode"], r.get("trace")) for r in runs if "error" not in r])
    md += ["Bars: " + ", ".join(f"{k} = {v if isinstance(v, bool) else round(v, 3)}" for k, v in bars.items()), "",
           f"Wall time {result['wall_seconds']:.0f} s."]

    def plot(plt):
        ok = [r for r in runs if "error" not in r]
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(ok)), 4.5))
        xs = range(len(ok))
        bottom = [0.0] * len(ok)
        ax.bar(xs, [r["ms_per_minibatch"] for r in ok], color="tab:blue", label="ms / minibatch")
        ax.bar(xs, [r["train_ms"] if r["train_ms"] == r["train_ms"] else 0 for r in ok], bottom=bottom,
               color="tab:green", width=0.4, label="of which the GPU trains")
        ax.scatter(xs, [r["link_floor_ms"] for r in ok], color="black", marker="_", s=400, label="link-bound floor")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["mode"] for r in ok], rotation=20)
        ax.set_ylabel("ms per minibatch")
        ax.set_title(f"GraphSAGE, {table_bytes / 2**30:.3g} GiB host feature table"
                     + ("" if fresh else " (REPLAY DIAGNOSTIC)"))
        ax.legend()

    write_report(args.out, args.name or ("training_quick" if q else "training"), result, md, plot)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
