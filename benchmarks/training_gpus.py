"""Data-parallel scaling of GraphSAGE training as users run it (``benchmarks/training.py --gpus 1,2,4``).

For each GPU count and row, :func:`pytorch_zerocopy.train.train_data_parallel` runs one pipeline
per GPU on the plan :func:`~pytorch_zerocopy.pipeline.make_plan` makes for that many local
processes, every minibatch freshly sampled. The rows are the single-GPU benchmark's
(:data:`benchmarks.pipeline_common.CORE_ROWS`): ``default`` (what ``zerocopy train --gpus N``
does with no flags), ``gpu`` (the table in each GPU's memory: the reference), and the baselines
``dma``, ``gpu_sampling_dma`` and ``uva_naive``. ``--baseline-gpus`` limits the baselines to some
GPU counts (default: the largest), as the bars compare them there only. The labelled rows
(:data:`LABELLED_ROWS`: settings a user could pick, the other shapes of one machine among them,
never a bar) run where the baselines run, when ``--rows`` names them.

Every GPU count trains the same global epoch (``--global-batches`` minibatches, split evenly
between the ranks), so epoch times compare directly. A rank's epoch time is its steady-state time
per minibatch (the first minibatch, which carries the pipeline's fill, left out) times its
minibatches; the job's is the slowest rank's. ``--repeats`` rounds each visit every (GPU count,
row), so a slow spell of the machine hits both sides of a ratio; bars divide medians, with min and
max beside them. Each rank's input wait (share of its steady time blocked on its next minibatch)
and GPU busy share (its training steps' GPU time over its steady time) are kept, with the
median of every timing of its trace (the gathering side's host time to issue a sample among
them: it grows when one gatherer's threads contend for the interpreter), and the job's
peak host memory (``MemTotal - MemAvailable`` sampled every 50 ms, over the same before the
dataset existed: every process and shared memory included).

``--kill-check`` adds the checkpoint bar: a 2-GPU default job with ``--checkpoint`` whose rank 1
trainer is SIGKILLed in the middle of its second epoch, restarted (``max_restarts=1``: on one
machine the whole job, its MPS daemon and gatherer included), against the same job
uninterrupted. ``--soak FILE`` folds the bars of a ``benchmarks/soak.py`` result into this one's.
``--append FILE`` adds the runs of an earlier part of the same benchmark (same configuration),
so one result file set can be made in several calls. The JSON is rewritten after every run.
Results: ``training_gpus.{json,md,png}``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

import torch

from benchmarks.pipeline_common import (BASELINES, CORE_ROWS, CacheRowChoices, PeakHostMemory, data_bytes,
                                        header_lines, machine_info, measure_ceilings, papers_dataset, trace_mean,
                                        used_host_bytes, write_report)

BAR_SCALING = {2: 1.85, 4: 3.5}     # default on N GPUs over 1 GPU (epoch-time ratio of medians)
BAR_OVER_BASELINE = 2.0             # default over the best baseline on the largest GPU count
BAR_HOST_BYTES = 1.2                # peak host memory over features + graph on the largest GPU count
BAR_SOAK_MIB = 64.0
# Settings a user could pick, run where the baselines run (never a bar).
LABELLED_ROWS = {"default[producer_share_25]": ("zerocopy", {"producer_share": 25.0}),
                 "default[no_cache]": ("zerocopy", {"cache": None}),
                 # A producer per GPU, every one mapping one shared table (the default beyond
                 # MACHINE_GATHERER_TRAINERS GPUs), and the machine's one gatherer (the default up to it).
                 "default[producer_per_gpu]": ("zerocopy", {"gather_in": "producer"}),
                 "default[machine_gatherer]": ("zerocopy", {"gather_in": "machine"}),
                 # A producer per GPU sampling and filling its ring, its rows read by the machine's
                 # one gatherer from the one table in the fastest kind.
                 "default[machine_reads]": ("zerocopy", {"gather_in": "machine-reads"}),
                 # The shared graph and table where the kernel first places them (no interleave).
                 "default[no_numa]": ("zerocopy", {"numa_nodes": ()})}
ROWS = {**CORE_ROWS, **LABELLED_ROWS}


def rank_record(rank: int, last) -> Dict[str, Any]:
    """One rank's timed epoch (:class:`~pytorch_zerocopy.pipeline.EpochStats`) as plain values."""
    per_mb = last.steady_ms_per_minibatch / 1e3
    steady = last.steady_seconds if last.steady_batches >= 1 else last.train_seconds
    trace = last.trace
    train_ms = (trace.per_step.get("gpu_train_ms") or []) if trace is not None else []
    return {"rank": rank, "epoch_seconds": per_mb * last.train_batches, "minibatches": last.train_batches,
            "ms_per_minibatch": per_mb * 1e3,
            "feature_bytes_per_s": (last.steady_bytes / steady) if last.steady_batches >= 1 and steady > 0 else 0.0,
            "input_wait_share": last.input_wait_share,
            "gpu_busy_share": sum(train_ms) / (steady * 1e3) if train_ms and steady > 0 else float("nan"),
            "sample_ms": trace_mean(trace.producer.get("sample_ms")) if trace is not None else float("nan"),
            "gather_ms": trace_mean(trace.producer.get("gather_ms")) if trace is not None else float("nan"),
            "p50_ms": _p50s(trace), "cache_hit_rate": last.cache_hit_rate, "val_acc": last.val_acc, "loss": last.loss,
            "partition": _partition(last.partition), "train_step": last.train_step,
            "param_checksum": last.param_checksum}


def _p50s(trace) -> Dict[str, float]:
    """The median of every timing of a rank's trace (``producer.sample_ms``, ``consumer.issue_ms``, ...)."""
    if trace is None:
        return {}
    return {f"{side}.{key}": summary["p50"] for side in ("producer", "consumer")
            for key, summary in getattr(trace, side).items() if summary.get("n")}


def _partition(info) -> Optional[Dict[str, Any]]:
    """A :class:`~pytorch_zerocopy.pipeline.PartitionInfo` as plain values (its kind by name)."""
    return None if info is None else {**asdict(info), "kind": info.kind.value}


def run_record(gpus: int, row: str, results: Dict[int, List], wall: float, peak_host_bytes: int = 0,
               plan: str = "") -> Dict[str, Any]:
    """One (GPU count, row) job as the report keeps it, from each rank's epoch statistics (the
    last epoch is the timed one); plain values only."""
    ranks = [rank_record(rank, epochs[-1]) for rank, epochs in sorted(results.items())]
    epoch = max(r["epoch_seconds"] for r in ranks)
    minibatches = sum(r["minibatches"] for r in ranks)
    return {"gpus": gpus, "mode": row, "plan": plan, "epoch_seconds": epoch, "minibatches": minibatches,
            "ms_per_minibatch": epoch / max(1, minibatches) * 1e3, "minibatches_per_s": minibatches / epoch,
            "feature_gbs": sum(r["feature_bytes_per_s"] for r in ranks) / 1e9,
            "input_wait_share": max(r["input_wait_share"] for r in ranks),
            "gpu_busy_share": min(r["gpu_busy_share"] for r in ranks),
            "val_acc": ranks[0]["val_acc"], "partition": ranks[0]["partition"], "wall_seconds": wall,
            "peak_host_bytes": peak_host_bytes, "ranks": ranks}


def _job(ds, gpus: int, row: str, args, baseline_bytes: int,
         cache_rows: Optional[CacheRowChoices] = None) -> Dict[str, Any]:
    """One training job of ``row`` on ``gpus`` GPUs, timed over its last epoch; ``cache_rows``:
    the run's cache rows, chosen once for every job (else this job chooses its own). A job whose
    table is shareable makes the dataset's one shared copy; it is dropped after the job (the
    dataset's feature source put back), so the next job's peak host memory holds only its own."""
    from pytorch_zerocopy.pipeline import make_plan
    from pytorch_zerocopy.train import train_data_parallel

    mode, settings = ROWS[row]
    plan = make_plan(mode, row_bytes=ds.row_bytes, table_bytes=ds.feature_source.nbytes, local_processes=gpus,
                     **_shape(args, args.global_batches // gpus), trace=True, **settings)
    source = ds.feature_source
    start = time.perf_counter()
    try:
        with PeakHostMemory() as memory:
            results = train_data_parallel(ds, gpus, plan=plan, quiet=True,
                                          cached_rows=cache_rows(plan) if cache_rows is not None else None)
    finally:
        ds.feature_source = source
    return run_record(gpus, row, results, time.perf_counter() - start, memory.peak - baseline_bytes, plan.describe())


def _shape(args, per_rank: int) -> Dict[str, Any]:
    return dict(fanouts=tuple(int(f) for f in args.fanouts.split(",")), batch_size=args.batch_size,
                epochs=args.epochs, max_batches=per_rank, val_batches=1, hidden=args.hidden)


def spread(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs: List[Dict[str, Any]], data_size: int, table_bytes: int) -> Tuple[Dict, Dict[str, Any], Dict]:
    """The epoch-time spread of each (GPU count, row) (``{(gpus, row): spread}``), the bars and
    the bars' spreads (ratios of the extremes), from :func:`run_record` records (failed runs,
    ``{"gpus", "mode", "error"}``, count nowhere)."""
    times: Dict[Tuple[int, str], List[float]] = {}
    peaks: Dict[Tuple[int, str], List[int]] = {}
    for r in runs:
        if "error" not in r:
            times.setdefault((r["gpus"], r["mode"]), []).append(r["epoch_seconds"])
            peaks.setdefault((r["gpus"], r["mode"]), []).append(r.get("peak_host_bytes", 0))
    cells = {key: spread(v) for key, v in times.items()}
    counts = sorted({g for g, _ in cells})
    bars: Dict[str, Any] = {"fresh_sampling": not any(r.get("replay") for r in runs), "table_gib": table_bytes / 2**30}
    ranges: Dict[str, Any] = {}
    one = cells.get((1, "default"))
    for g in counts:
        here = cells.get((g, "default"))
        if g > 1 and one and here:
            name = f"default_{g}gpu_over_1gpu"
            bars[name] = one["median"] / here["median"]
            ranges[name] = {"min": one["min"] / here["max"], "max": one["max"] / here["min"]}
            if g in BAR_SCALING:
                bars[f"{name}_at_least_{BAR_SCALING[g]}x"] = bars[name] >= BAR_SCALING[g]
    top = max(counts) if counts else 0
    default = cells.get((top, "default"))
    baselines = {b: cells[(top, b)] for b in BASELINES if (top, b) in cells}
    if default and baselines:
        best = min(baselines, key=lambda b: baselines[b]["median"])
        name = f"default_over_best_baseline_{top}gpu"
        bars[f"best_baseline_{top}gpu"] = best
        bars[name] = baselines[best]["median"] / default["median"]
        ranges[name] = {"min": baselines[best]["min"] / default["max"], "max": baselines[best]["max"] / default["min"]}
        bars[f"{name}_at_least_{BAR_OVER_BASELINE:g}x"] = bars[name] >= BAR_OVER_BASELINE
    if default:
        name = f"host_bytes_over_data_{top}gpu"
        bars[name] = max(peaks[(top, "default")]) / data_size
        bars[f"{name}_within_{BAR_HOST_BYTES}x"] = bars[name] <= BAR_HOST_BYTES
    gpu_one, gpu_top = cells.get((1, "gpu")), cells.get((top, "gpu"))
    if default and gpu_top:
        ranges[f"default_over_gpu_{top}gpu"] = default["median"] / gpu_top["median"]
    if gpu_one and gpu_top and top > 1:
        ranges[f"gpu_{top}gpu_over_1gpu"] = gpu_one["median"] / gpu_top["median"]
    return cells, bars, ranges


def _fmt(v: Any) -> str:
    return str(v) if isinstance(v, (bool, str)) else f"{v:.3g}"


def report_lines(runs: List[Dict[str, Any]], cells: Dict, bars: Dict[str, Any], ranges: Dict[str, Any]) -> List[str]:
    """The report's tables (medians per GPU count and row, then every run with its ranks' input
    wait and GPU busy share) and its bars, as Markdown lines."""
    md = ["| GPUs | row | epoch s (median) | min | max | n | ms / minibatch (median) | vs 1 GPU | vs gpu |",
          "|---|---|---|---|---|---|---|---|---|"]
    for (g, row), s in sorted(cells.items()):
        one, ref = cells.get((1, row)), cells.get((g, "gpu"))
        runs_here = [r for r in runs if r["gpus"] == g and r["mode"] == row and "error" not in r]
        per_mb = statistics.median(r["ms_per_minibatch"] for r in runs_here)
        md.append(f"| {g} | {row} | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} | {s['n']} | {per_mb:.3f} | "
                  + (f"{one['median'] / s['median']:.2f}x" if one and g > 1 else "-") + " | "
                  + (f"{s['median'] / ref['median']:.2f}" if ref else "-") + " |")
    md += ["", "Every run (input wait: the largest over the ranks; GPU busy: the smallest):", "",
           "| round | GPUs | row | epoch s | minibatches/s | feature GB/s (all GPUs) | input wait | GPU busy | "
           "per-rank input wait | per-rank GPU busy | peak host GiB | partition | val acc |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            md.append(f"| {r.get('repeat', '-')} | {r['gpus']} | {r['mode']} | failed: {r['error']} |" + " |" * 9)
            continue
        part = r["partition"] or {}
        waits = " / ".join(f"{k['input_wait_share']:.0%}" for k in r["ranks"])
        busy = " / ".join(f"{k['gpu_busy_share']:.0%}" for k in r["ranks"])
        md.append(f"| {r.get('repeat', '-')} | {r['gpus']} | {r['mode']} | {r['epoch_seconds']:.3f} | "
                  f"{r['minibatches_per_s']:.1f} | {r['feature_gbs']:.1f} | {r['input_wait_share']:.0%} | "
                  f"{r['gpu_busy_share']:.0%} | {waits} | {busy} | {r.get('peak_host_bytes', 0) / 2**30:.1f} | "
                  f"{part.get('kind', '-')} | {r['val_acc']:.3f} |")
    md += ["", "Bars (medians; min/max ratios in the JSON's `spread`): "
           + ", ".join(f"{k} = {_fmt(v)}" for k, v in bars.items())]
    if ranges:
        md += ["", "Spread and references: " + ", ".join(
            f"{k} = {_fmt(v) if not isinstance(v, dict) else '{:.3g}..{:.3g}'.format(v['min'], v['max'])}"
            for k, v in ranges.items())]
    return md


def kill_check(ds, args, gpus: int = 2, cache_rows: Optional[CacheRowChoices] = None) -> Dict[str, Any]:
    """The default plan on ``gpus`` GPUs for 3 epochs with a checkpoint, once uninterrupted and
    once with rank 1's trainer SIGKILLed halfway through epoch 1 and the job restarted; what the
    restarted job trained, and whether it lost at most the epoch in flight."""
    from pytorch_zerocopy.launch import LaunchOptions
    from pytorch_zerocopy.pipeline import checkpoint, make_plan
    from pytorch_zerocopy.pipeline.plan import InjectedFailure
    from pytorch_zerocopy.train import train_data_parallel

    per_rank = 40
    shape = dict(_shape(args, per_rank), epochs=3)
    root = tempfile.mkdtemp(prefix="zc-kill-")
    shm_before = set(os.listdir("/dev/shm"))
    try:
        def job(name: str, **settings):
            plan = make_plan("zerocopy", row_bytes=ds.row_bytes, table_bytes=ds.feature_source.nbytes,
                             local_processes=gpus, checkpoint_dir=os.path.join(root, name), **shape, **settings)
            start = time.perf_counter()
            results = train_data_parallel(ds, gpus, plan=plan, quiet=True,
                                          cached_rows=cache_rows(plan) if cache_rows is not None else None,
                                          launch_options=LaunchOptions(max_restarts=1 if "inject_failure" in settings else 0))
            return results, time.perf_counter() - start

        reference, ref_s = job("reference")
        # The trainer counts training then validation minibatches (val_batches=1): epoch 1's
        # training starts at minibatch per_rank + 1.
        kill_at = per_rank + 1 + per_rank // 2
        restarted, killed_s = job("killed", inject_failure=InjectedFailure("consumer", "kill", kill_at, rank=1, attempt=0))
        saved = checkpoint.load(os.path.join(root, "killed"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    epochs = {rank: [e.epoch for e in stats] for rank, stats in restarted.items()}
    final, expected = restarted[0][-1], reference[0][-1]
    same_accuracy = abs(final.test_acc - expected.test_acc) <= 0.05
    lost_at_most_one = all(e and e[0] >= 1 and e[-1] == 2 for e in epochs.values()) and saved.epoch == 2
    return {"gpus": gpus, "minibatches_per_rank_epoch": per_rank, "killed_rank": 1, "killed_at_minibatch": kill_at,
            "restarted_epochs": {str(k): v for k, v in epochs.items()},
            "test_acc": final.test_acc, "reference_test_acc": expected.test_acc,
            "reference_seconds": ref_s, "killed_job_seconds": killed_s,
            "shm_left": sorted(set(os.listdir("/dev/shm")) - shm_before),
            "resume_loses_at_most_one_epoch": bool(lost_at_most_one and same_accuracy)}


def _soak_bars(path: str) -> Dict[str, Any]:
    with open(path) as f:
        soak = json.load(f)
    bars = soak.get("bars", {})
    out = {k: v for k, v in bars.items() if k.startswith("soak_")}
    if "soak_growth_mib" in out:
        out[f"soak_growth_within_{BAR_SOAK_MIB:g}mib"] = out["soak_growth_mib"] <= BAR_SOAK_MIB
    return out


def run_scaling(args, gpu_counts: List[int], notes: List[str]) -> int:
    available = torch.cuda.device_count()
    wanted = max(gpu_counts)
    if wanted > available:
        print(f"--gpus asks for {wanted} GPUs, this machine has {available}")
        return 2
    table_gib = args.table_gib or 32.0
    args.global_batches = args.global_batches or 480
    if args.global_batches % wanted:
        args.global_batches += wanted - args.global_batches % wanted
    rows = [r for r in (args.rows or ",".join(CORE_ROWS)).split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        print(f"--rows: unknown rows {unknown}; choose from {list(ROWS)}")
        return 2
    baseline_gpus = {int(g) for g in (args.baseline_gpus or str(wanted)).split(",") if g.strip()}
    earlier = _load_append(args.append) if args.append else None
    t_start = time.perf_counter()
    info = machine_info()
    info["gpus"] = available
    notes = notes + [f"every GPU count trains the same {args.global_batches} minibatches per epoch, split evenly "
                     "between the ranks; epoch time = the slowest rank's steady-state time per minibatch x its "
                     "minibatches; batch "
                     f"{args.batch_size}, fanouts {args.fanouts}, hidden {args.hidden}, {args.epochs} epochs per "
                     "run (the last timed)",
                     "each row on N GPUs is the plan make_plan makes for N local processes (zerocopy train --gpus N)",
                     f"baselines ({', '.join(BASELINES)}) and labelled rows ({', '.join(LABELLED_ROWS)}) run on "
                     f"{sorted(baseline_gpus)} GPU(s)",
                     "peak host: the job's largest MemTotal - MemAvailable over the same before the dataset existed"]
    print("\n".join(notes), flush=True)
    baseline_bytes = used_host_bytes()
    print(f"data-parallel scaling: table {table_gib:g} GiB, width {args.width}, GPUs {gpu_counts}", flush=True)
    ds = papers_dataset(table_gib, args.width, args.degree)
    cache_rows = CacheRowChoices(ds)
    size, table_bytes, described = data_bytes(ds), ds.feature_source.nbytes, ds.describe()
    ceilings = measure_ceilings(None, 0, gpus=wanted)
    print(f"  ceilings (GPU 0): {ceilings}", flush=True)
    runs: List[Dict[str, Any]] = list(earlier["runs"]) if earlier else []
    extra: Dict[str, Any] = dict(earlier.get("checks", {})) if earlier else {}
    name = args.name or "training_gpus"

    def write() -> None:
        cells, bars, ranges = summarise(runs, size, table_bytes)
        if "kill_check" in extra:
            bars["resume_loses_at_most_one_epoch"] = extra["kill_check"]["resume_loses_at_most_one_epoch"]
        if args.soak:
            bars.update(_soak_bars(args.soak))
        result = {"machine": info, "notes": notes, "ceilings": ceilings, "dataset": described, "data_bytes": size,
                  "table_bytes": table_bytes, "global_minibatches": args.global_batches, "runs": runs,
                  "cells": [{"gpus": g, "row": r, **s} for (g, r), s in sorted(cells.items())],
                  "bars": bars, "spread": ranges, "checks": extra, "config": vars(args),
                  "parts": (earlier.get("parts", 1) + 1) if earlier else 1,
                  "wall_seconds": time.perf_counter() - t_start}
        md = header_lines("GraphSAGE data-parallel training, every minibatch sampled: epoch time per GPU count",
                          info, ceilings)
        md += ["Notes: " + "; ".join(notes) + ".", "",
               f"Dataset: {described}; features + graph {size / 2**30:.1f} GiB.", ""]
        md += report_lines(runs, cells, bars, ranges)
        if "kill_check" in extra:
            k = extra["kill_check"]
            md += ["", f"Kill check: {k['gpus']} GPUs, rank {k['killed_rank']}'s trainer SIGKILLed at minibatch "
                       f"{k['killed_at_minibatch']} (epoch 1 of 3); the restarted job trained epochs "
                       f"{k['restarted_epochs']}, test accuracy {k['test_acc']:.3f} vs {k['reference_test_acc']:.3f} "
                       f"uninterrupted; /dev/shm left: {k['shm_left'] or 'nothing'}."]
        md += ["", f"Wall time {result['wall_seconds']:.0f} s."]
        write_report(args.out, name, result, md, _plot(cells, gpu_counts, table_bytes, args.global_batches))

    for rep in range(args.repeats):
        for g in gpu_counts:
            for row in rows:
                if (row in BASELINES or row in LABELLED_ROWS) and g not in baseline_gpus:
                    continue
                try:
                    r = _job(ds, g, row, args, baseline_bytes, cache_rows)
                except Exception as e:  # noqa: BLE001 - report and go on
                    r = {"gpus": g, "mode": row, "error": str(e).strip().splitlines()[-1][:500]}
                r["repeat"] = rep + (earlier.get("repeats", 0) if earlier else 0)
                print(f"  round {rep} {g} GPU(s) {row}: " + (
                    f"{r['epoch_seconds']:.3f} s/epoch ({r['ms_per_minibatch']:.2f} ms/minibatch), input wait "
                    f"{r['input_wait_share']:.0%}, GPU busy {r['gpu_busy_share']:.0%}, peak host "
                    f"{r['peak_host_bytes'] / 2**30:.1f} GiB, {r['wall_seconds']:.0f} s" if "error" not in r
                    else f"FAILED {r['error']}"), flush=True)
                runs.append(r)
                gc.collect()
                write()
    if args.kill_check:
        try:
            extra["kill_check"] = kill_check(ds, args, cache_rows=cache_rows)
        except Exception as e:  # noqa: BLE001 - a failed check is a result
            extra["kill_check"] = {"error": str(e).strip().splitlines()[-1][:500], "gpus": 2, "killed_rank": 1,
                                   "killed_at_minibatch": -1, "restarted_epochs": {}, "test_acc": float("nan"),
                                   "reference_test_acc": float("nan"), "shm_left": [],
                                   "resume_loses_at_most_one_epoch": False}
        print(f"  kill check: {extra['kill_check']}", flush=True)
    del ds, cache_rows
    gc.collect()
    write()
    with open(os.path.join(args.out, f"{name}.md")) as f:
        print(f.read())
    return 0


def _load_append(path: str) -> Dict[str, Any]:
    with open(path) as f:
        earlier = json.load(f)
    earlier["repeats"] = 1 + max((r.get("repeat", 0) for r in earlier["runs"]), default=-1)
    return earlier


def _plot(cells: Dict, gpu_counts: List[int], table_bytes: int, global_batches: int):
    def plot(plt):
        rows = sorted({r for _, r in cells}, key=list(ROWS).index)
        _, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / max(1, len(gpu_counts))
        for i, g in enumerate(gpu_counts):
            xs = [j + i * width for j, r in enumerate(rows) if (g, r) in cells]
            ys = [cells[(g, r)]["median"] for r in rows if (g, r) in cells]
            ax.bar(xs, ys, width=width, label=f"{g} GPU(s)")
        ax.set_xticks([j + width * (len(gpu_counts) - 1) / 2 for j in range(len(rows))])
        ax.set_xticklabels(rows)
        ax.set_ylabel(f"epoch time (s), {global_batches} minibatches")
        ax.set_title(f"Data-parallel GraphSAGE, {table_bytes / 2**30:.3g} GiB host feature table")
        ax.legend()

    return plot
