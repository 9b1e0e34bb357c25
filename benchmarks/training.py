"""GraphSAGE training time: the plan ``zerocopy train`` makes with no flags against the table in
GPU memory and the paths a user would otherwise pick, every minibatch freshly sampled.

    python benchmarks/training.py            # GPU: 16 GiB table (and 56 GiB for the scale bar)
    python benchmarks/training.py --quick    # CPU, seconds: the CPU pipeline on a small table
    python benchmarks/training.py --gpus 1,2,4 --table-gib 56  # data-parallel scaling (training_gpus.*)

One papers100M-like graph (``papers_like``, skew 2, ~15 in-edges a node) whose float32 feature
table holds ``--table-gib`` GiB; batch 1024, fanouts 15,10, hidden 256. Each run trains
``--epochs`` epochs of ``--max-batches`` minibatches and is timed over its last epoch at its
steady-state rate (its first minibatch, which carries the pipeline's fill, left out). Every run
is a job as a user runs it: the process that reads the features loads them itself, straight from
the dataset's generator, into the placement its plan picks.

Rows, each run ``--repeats`` times, the repeats alternating (A B C ... A B C ...):

* ``default``: the plan ``zerocopy train`` makes with no flags (``make_plan('zerocopy')``);
* ``gpu``: the table copied into GPU memory, sampled on the GPU (the upper bound);
* ``dma``: CPU sampling in sampler processes, CPU gather into pinned slots, copy (DGL's default);
* ``gpu_sampling_dma``: GPU sampling, the CPU gather on every core into pinned slots, copy,
  overlapped with training (the strongest copy path);
* ``uva_naive``: GPU sampling and an unaligned zero-copy ``index_select`` inside the trainer
  (DGL's UVA mode).

Labelled rows, once each (settings a user could pick; never a bar): the default with its table
mapped instead (``default[mapped]``), without its cache (``default[no cache]``), with the
neighbour lists in managed memory (``default[lists managed]``). ``--scale-gib`` runs the default
again on a larger table (the scale bar). Bars are medians of the repeats, min and max beside
them; the job's peak host memory is ``MemTotal - MemAvailable`` sampled every 50 ms during the
run, over the same before the dataset existed. Results: ``training.{json,md,png}``
(``training_quick`` with ``--quick``).
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

from benchmarks.pipeline_common import (BASELINES, CORE_ROWS, CacheRowChoices, PeakHostMemory, data_bytes,  # noqa: E402
                                        header_lines, machine_info, measure_ceilings, papers_dataset, trace_lines,
                                        trace_mean, used_host_bytes, write_report)

LABELLED_ROWS = {
    "default[mapped]": ("zerocopy", {"feature_placement": "unified"}),
    "default[no cache]": ("zerocopy", {"cache": None}),
    "default[lists managed]": ("zerocopy", {"graph_placement": "managed"}),
}
QUICK_ROWS = {"default": ("zerocopy", {}), "cpu": ("cpu", {})}
BAR_MS = 1.6
BAR_OVER_GPU = 1.25
BAR_OVER_BASELINE = 2.0
BAR_HOST_BYTES = 1.2
BAR_SCALE = 1.15


def _run(ds, label: str, mode: str, args, baseline_bytes: int, ceiling_gbs: float,
         cache_rows: Optional[CacheRowChoices] = None, **settings) -> Dict:
    """One training job; the row of its last (timed) epoch. ``cache_rows``: the run's cache rows,
    chosen once for every job (else this job chooses its own)."""
    from pytorch_zerocopy.pipeline import make_plan
    from pytorch_zerocopy.train import run_plan

    shape = dict(fanouts=tuple(int(f) for f in args.fanouts.split(",")), batch_size=args.batch_size,
                 epochs=args.epochs, max_batches=args.max_batches, val_batches=1, hidden=args.hidden, trace=True)
    start = time.perf_counter()
    plan = make_plan(mode, row_bytes=ds.row_bytes, table_bytes=ds.feature_source.nbytes, **shape, **settings)
    with PeakHostMemory() as memory:
        epochs = run_plan(plan, ds, mps_fallback=True, quiet=True,
                          cached_rows=cache_rows(plan) if cache_rows is not None else None)
    wall = time.perf_counter() - start
    last = epochs[-1]
    ms = last.steady_ms_per_minibatch
    batches = last.steady_batches if last.steady_batches >= 1 else last.train_batches
    nbytes = last.steady_bytes if last.steady_batches >= 1 else last.feature_bytes
    seconds = ms * batches / 1e3
    rows = nbytes / max(1, batches) / ds.row_bytes
    trace = last.trace
    gpu = "gpu_train_ms" in trace.per_step
    train_ms = trace.per_step.get("gpu_train_ms" if gpu else "issue_ms", [])
    floor_ms = rows * ds.row_bytes / (ceiling_gbs * 1e9) * 1e3 if ceiling_gbs == ceiling_gbs else float("nan")
    return {"mode": label, "base_mode": mode, "plan": plan.describe(), "settings": plan.settings(),
            "ms_per_minibatch": ms, "minibatches": last.train_batches,
            "sample_ms": trace_mean(trace.producer.get("sample_ms")),
            "gather_ms": trace_mean(trace.producer.get("gather_ms")),
            "train_ms": statistics.fmean(train_ms) if train_ms else float("nan"),
            "gpu_busy_share": sum(train_ms) / (seconds * 1e3) if gpu and seconds > 0 else float("nan"),
            "input_wait_share": last.input_wait_share, "input_rows": rows, "link_floor_ms": floor_ms,
            "feature_gbs": nbytes / seconds / 1e9 if seconds > 0 else float("nan"), "val_acc": last.val_acc,
            "wall_seconds": wall, "cache_rows": last.cache_rows, "cache_hit_rate": last.cache_hit_rate,
            "peak_host_bytes": memory.peak - baseline_bytes,
            "partition": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(last.partition).items()
                          if v is not None},
            "trace": asdict(trace)}


def _attempt(fn, label):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report and go on with the other runs
        return {"mode": label, "error": str(e).strip().splitlines()[-1][:500]}


def summarise(runs: List[Dict], label: str) -> Optional[Dict[str, float]]:
    """Median, min and max of a row's repeats (None when none succeeded)."""
    ms = [r["ms_per_minibatch"] for r in runs if r["mode"] == label and "error" not in r]
    if not ms:
        return None
    peaks = [r["peak_host_bytes"] for r in runs if r["mode"] == label and "error" not in r]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "n": len(ms),
            "peak_host_bytes": max(peaks)}


def _line(r: Dict) -> str:
    if "error" in r:
        return f"  {r['mode']}: FAILED {r['error']}"
    return (f"  {r['mode']}: {r['ms_per_minibatch']:.2f} ms/minibatch (sample {r['sample_ms']:.2f}, gather "
            f"{r['gather_ms']:.2f}, train {r['train_ms']:.2f}), GPU busy {r['gpu_busy_share']:.0%}, input wait "
            f"{r['input_wait_share']:.0%}, {r['feature_gbs']:.1f} GB/s, peak host {r['peak_host_bytes'] / 2**30:.1f} "
            f"GiB, {r['wall_seconds']:.0f} s" + (f", cache held {r['cache_hit_rate']:.0%}" if r.get("cache_rows") else ""))


def _table(summaries: Dict[str, Dict], runs: List[Dict], gpu_ms: float) -> List[str]:
    lines = ["| run | ms / minibatch (median) | min | max | n | x gpu | sample ms | gather ms | train ms | GPU busy | "
             "input wait | feature GB/s | peak host GiB | val acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in summaries.items():
        last = [r for r in runs if r["mode"] == label and "error" not in r]
        if s is None or not last:
            failed = [r for r in runs if r["mode"] == label]
            lines.append(f"| {label} | failed: {failed[0]['error'] if failed else 'not run'} |" + " |" * 12)
            continue
        r = last[-1]
        lines.append(f"| {label} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} | {s['n']} | "
                     f"{s['median'] / gpu_ms:.2f} | {r['sample_ms']:.2f} | {r['gather_ms']:.2f} | {r['train_ms']:.2f} | "
                     f"{r['gpu_busy_share']:.0%} | {r['input_wait_share']:.0%} | {r['feature_gbs']:.1f} | "
                     f"{s['peak_host_bytes'] / 2**30:.1f} | {r['val_acc']:.3f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU, seconds: the CPU pipeline on a small table")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--name", default=None, help="base name of the result files (default training[_quick])")
    p.add_argument("--table-gib", type=float, default=None, help="feature table size (default 16; quick 0.1)")
    p.add_argument("--scale-gib", type=float, default=None,
                   help="one GPU: the default plan again on a table of this size, for the scale bar (default 56; "
                        "0: not run); with --gpus the table is --table-gib")
    p.add_argument("--width", type=int, default=128, help="feature width (float32)")
    p.add_argument("--rows", default=None, help=f"core rows (default {','.join(CORE_ROWS)}; quick default,cpu)")
    p.add_argument("--labelled", action=argparse.BooleanOptionalAction, default=True,
                   help="run the labelled rows (default[mapped], default[no cache], default[lists managed])")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every core row, alternating")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the last is timed")
    p.add_argument("--max-batches", type=int, default=None, help="minibatches per epoch (default 100; quick 6)")
    p.add_argument("--batch-size", type=int, default=None, help="seeds per minibatch (default 1024; quick 256)")
    p.add_argument("--fanouts", default=None, help="default 15,10; quick 10,5")
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--hidden", type=int, default=None, help="default 256; quick 64")
    p.add_argument("--gpus", default="1", help="'1': one GPU; counts such as '1,2,4': data-parallel scaling "
                                               "(training_gpus.*; --table-gib default 32)")
    p.add_argument("--global-batches", type=int, default=None,
                   help="with --gpus: minibatches per epoch over all ranks (default 480)")
    p.add_argument("--baseline-gpus", default=None, help="with --gpus: GPU counts the baselines run on (default: the largest)")
    p.add_argument("--kill-check", action="store_true",
                   help="with --gpus: kill a rank of a 2-GPU checkpointed job mid-epoch and check its resume")
    p.add_argument("--soak", default=None, metavar="FILE", help="with --gpus: fold a soak.py result's bars in")
    p.add_argument("--append", default=None, metavar="FILE",
                   help="with --gpus: add the runs of an earlier part of this benchmark (same configuration)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be a positive count, got {args.repeats}")
    try:
        gpu_counts = sorted({int(g) for g in str(args.gpus).split(",") if g.strip()})
    except ValueError:
        p.error(f"--gpus must be GPU counts separated by commas, got {args.gpus!r}")
    import torch

    if gpu_counts != [1] and args.scale_gib is not None:
        p.error("--scale-gib sizes the single-GPU benchmark's scale run; with --gpus the table is --table-gib "
                "(default 32)")
    if args.scale_gib is None:
        args.scale_gib = 56.0
    if gpu_counts != [1]:
        args.batch_size, args.fanouts, args.hidden = args.batch_size or 1024, args.fanouts or "15,10", args.hidden or 256
        if not torch.cuda.is_available():
            print("no CUDA GPU: the data-parallel scaling benchmark needs GPUs", file=sys.stderr)
            return 2
        from benchmarks.training_gpus import run_scaling

        return run_scaling(args, gpu_counts, ["every minibatch sampled"])

    gpu = torch.cuda.is_available()
    q = args.quick or not gpu
    table = QUICK_ROWS if q else CORE_ROWS
    labels = [r for r in (args.rows or ",".join(table)).split(",") if r]
    unknown = [r for r in labels if r not in {**CORE_ROWS, **QUICK_ROWS}]
    if unknown:
        p.error(f"--rows: unknown rows {unknown}; choose from {sorted({**CORE_ROWS, **QUICK_ROWS})}")
    args.table_gib = args.table_gib or (0.1 if q else 16.0)
    args.max_batches = args.max_batches or (6 if q else 100)
    args.batch_size = args.batch_size or (256 if q else 1024)
    args.fanouts = args.fanouts or ("10,5" if q else "15,10")
    args.hidden = args.hidden or (64 if q else 256)
    t_start = time.perf_counter()
    info = machine_info()
    notes = [f"batch {args.batch_size}, fanouts {args.fanouts}, hidden {args.hidden}; {args.epochs} epochs of "
             f"{args.max_batches} minibatches per run, the last timed at its steady-state rate (its first minibatch "
             f"left out); {args.repeats} alternating repeats of each core row",
             "every minibatch freshly sampled; each job loads its own feature table from the generator into the "
             "placement its plan picks",
             "peak host: the job's largest MemTotal - MemAvailable over the same before the dataset existed "
             "(every process, shared memory included)"]
    print("\n".join(notes), flush=True)
    baseline_bytes = used_host_bytes()
    print(f"table {args.table_gib:g} GiB, width {args.width}", flush=True)
    ds = papers_dataset(args.table_gib, args.width, args.degree)
    cache_rows = CacheRowChoices(ds)
    data_size = data_bytes(ds)
    ceilings = measure_ceilings(None, 0) if gpu else {}
    ceiling = ceilings.get("pinned_memcpy_gbs", float("nan"))
    print(f"  ceilings: {ceilings}", flush=True)

    def job(label: str, mode: str, settings: Dict, dataset, cache_rows: CacheRowChoices) -> Dict:
        row = _attempt(lambda: _run(dataset, label, mode, args, baseline_bytes, ceiling, cache_rows, **settings),
                       label)
        print(_line(row), flush=True)
        return row

    runs: List[Dict] = []
    for _ in range(args.repeats):
        for label in labels:
            mode, settings = {**CORE_ROWS, **QUICK_ROWS}[label]
            runs.append(job(label, mode, dict(settings), ds, cache_rows))
    if args.labelled and not q:
        for label, (mode, settings) in LABELLED_ROWS.items():
            runs.append(job(label, mode, dict(settings), ds, cache_rows))
    described = ds.describe()
    del ds, cache_rows
    gc.collect()
    scale_runs: List[Dict] = []
    scale_data = None
    if args.scale_gib and not q and "default" in labels:
        print(f"scale: table {args.scale_gib:g} GiB", flush=True)
        big = papers_dataset(args.scale_gib, args.width, args.degree)
        big_cache_rows = CacheRowChoices(big)
        scale_data = (big.describe(), big.feature_source.nbytes + big.graph_bytes)
        for _ in range(args.repeats):
            scale_runs.append(job("default", "zerocopy", {}, big, big_cache_rows))
        del big, big_cache_rows
        gc.collect()

    summaries = {label: summarise(runs, label) for label in labels + (list(LABELLED_ROWS) if args.labelled and not q else [])}
    default = summaries.get("default")
    gpu_row = summaries.get("gpu")
    bars: Dict[str, object] = {"fresh_sampling": True}
    spread: Dict[str, object] = {}
    default_runs = [r for r in runs if r["mode"] == "default" and "error" not in r]
    if default is not None:
        bars["default_plan"] = default_runs[0]["plan"]
        bars["default_ms_per_minibatch"] = default["median"]
        spread["default_ms_per_minibatch"] = {"min": default["min"], "max": default["max"], "n": default["n"]}
        bars[f"default_at_most_{BAR_MS}ms"] = default["median"] <= BAR_MS
        bars["host_bytes_over_data"] = default["peak_host_bytes"] / data_size
        bars[f"host_bytes_within_{BAR_HOST_BYTES}x_data"] = bars["host_bytes_over_data"] <= BAR_HOST_BYTES
        if gpu_row is not None:
            bars["default_over_gpu_epoch_time"] = default["median"] / gpu_row["median"]
            spread["default_over_gpu_epoch_time"] = {"min": default["min"] / gpu_row["max"],
                                                     "max": default["max"] / gpu_row["min"]}
            bars[f"default_within_{BAR_OVER_GPU}x_gpu"] = bars["default_over_gpu_epoch_time"] <= BAR_OVER_GPU
        baselines = {b: summaries[b]["median"] for b in BASELINES if summaries.get(b) is not None}
        if baselines:
            best = min(baselines, key=baselines.get)
            bars["best_baseline"] = best
            bars["default_speedup_over_best_baseline"] = baselines[best] / default["median"]
            spread["default_speedup_over_best_baseline"] = {"min": summaries[best]["min"] / default["max"],
                                                            "max": summaries[best]["max"] / default["min"]}
            bars[f"default_at_least_{BAR_OVER_BASELINE:g}x_best_baseline"] = (
                bars["default_speedup_over_best_baseline"] >= BAR_OVER_BASELINE)
        scale = summarise(scale_runs, "default")
        if scale is not None:
            bars["scale56_over_16"] = scale["median"] / default["median"]
            spread["scale56_over_16"] = {"min": scale["min"] / default["max"], "max": scale["max"] / default["min"],
                                         "scale_gib": args.scale_gib, "scale_ms": scale}
            bars[f"scale_within_{BAR_SCALE}x"] = bars["scale56_over_16"] <= BAR_SCALE
            spread["scale_host_bytes_over_data"] = scale["peak_host_bytes"] / scale_data[1]
    result = {"machine": info, "notes": notes, "ceilings": ceilings, "dataset": described,
              "data_bytes": data_size, "runs": runs, "scale_runs": scale_runs,
              "scale_dataset": scale_data[0] if scale_data else None, "summaries": summaries, "bars": bars,
              "spread": spread, "config": vars(args), "wall_seconds": time.perf_counter() - t_start}

    md = header_lines("GraphSAGE training, every minibatch sampled: the default plan", info, ceilings)
    md += ["Notes: " + "; ".join(notes) + ".", "", f"Dataset: {described}; features + graph "
           f"{data_size / 2**30:.1f} GiB.", ""]
    if default_runs:
        md += [f"Default plan (what `zerocopy train` picks with no flags): {default_runs[0]['plan']}.", ""]
    md += _table(summaries, runs, gpu_row["median"] if gpu_row else float("nan"))
    if scale_runs:
        scale = summarise(scale_runs, "default")
        md += ["", f"Scale: {scale_data[0]}; default {scale['median']:.2f} ms (min {scale['min']:.2f}, max "
               f"{scale['max']:.2f}), peak host {scale['peak_host_bytes'] / 2**30:.1f} GiB for "
               f"{scale_data[1] / 2**30:.1f} GiB of data." if scale else "", ""]
    md += ["", "Per-minibatch timings of each row's last run:", ""]
    last_of = {r["mode"]: r for r in runs if "error" not in r}
    md += trace_lines([(label, r.get("trace")) for label, r in last_of.items()])
    md += ["Bars (medians; spread in the JSON): "
           + ", ".join(f"{k} = {v if isinstance(v, (bool, str)) else round(v, 3)}" for k, v in bars.items()), "",
           f"Wall time {result['wall_seconds']:.0f} s."]

    def plot(plt):
        ok = [(label, s) for label, s in summaries.items() if s is not None]
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(ok)), 4.5))
        xs = range(len(ok))
        ax.bar(xs, [s["median"] for _, s in ok], color="tab:blue", label="ms / minibatch (median)")
        ax.errorbar(xs, [s["median"] for _, s in ok], yerr=[[s["median"] - s["min"] for _, s in ok],
                                                            [s["max"] - s["median"] for _, s in ok]],
                    fmt="none", color="black", capsize=4, label="min / max")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([label for label, _ in ok], rotation=20)
        ax.set_ylabel("ms per minibatch")
        ax.set_title(f"GraphSAGE, {args.table_gib:g} GiB host feature table")
        ax.legend()

    write_report(args.out, args.name or ("training_quick" if q else "training"), result, md, plot)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
