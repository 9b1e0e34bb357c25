"""Data-parallel scaling of GraphSAGE training (``benchmarks/training.py --gpus 1,2``).

For each GPU count and each mode (dma, zerocopy-naive, zerocopy, gpu), the launcher of
:func:`pytorch_zerocopy.train.train_data_parallel` runs one pipeline per GPU over one shared
host copy of the dataset, gradients averaged over NCCL. Every GPU count trains the same global epoch
(``--max-batches`` minibatches in all, split evenly between the ranks), so epoch times compare
directly. A rank's epoch time is its steady-state time per minibatch (the first minibatch of
the epoch, which carries the pipeline's fill, is left out) times its minibatches; the job's is
the slowest rank's. With ``--repeats N`` every (GPU count, mode) runs N times, in rounds that
each visit every GPU count, so a slow spell of the machine hits both sides of a ratio; the bars
and the vs columns then use the median epoch time of each (GPU count, mode). Results:
``training_gpus.{json,md,png}``.

A run's record (:func:`run_record`) holds plain values only (the GPU partition by its name), so
the report (:func:`summarise`, :func:`report_lines`) and the JSON need no conversions.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple

import torch

from benchmarks.pipeline_common import header_lines, machine_info, measure_ceilings, trace_lines, write_report

SCALING_MODES = ("dma", "zerocopy-naive", "zerocopy", "gpu")
BAR_OVER_DMA = 1.65      # zerocopy vs dma on the largest GPU count
BAR_SCALING = 1.7        # zerocopy on 2 GPUs vs zerocopy on 1 GPU


def _run(ds, gpus: int, mode: str, args, global_batches: int) -> Dict:
    from pytorch_zerocopy.train import train_data_parallel

    per_rank = global_batches // gpus
    extra = {"producer_share": args.producer_share, "producer_sms": args.producer_sms} if mode == "zerocopy" else {}
    if args.eager:
        extra["cuda_graph"] = False
    if args.samplers is not None and mode == "dma":
        extra["num_samplers"] = args.samplers
    if args.trace:
        extra["trace"] = True
    start = time.perf_counter()
    results = train_data_parallel(ds, gpus, mode, args.partition if mode == "zerocopy" else "auto",
                                  fanouts=[int(f) for f in args.fanouts.split(",")], batch_size=args.batch_size,
                                  epochs=args.epochs, quiet=True, max_batches=per_rank, replay=args.replay,
                                  val_batches=1, hidden=args.hidden, **extra)
    return run_record(gpus, mode, results, time.perf_counter() - start)


def _partition(info) -> Dict[str, Any]:
    """A :class:`~pytorch_zerocopy.pipeline.PartitionInfo` as plain values (its kind by name)."""
    return {**asdict(info), "kind": info.kind.value}


def run_record(gpus: int, mode: str, results: Dict[int, List], wall: float) -> Dict[str, Any]:
    """One (GPU count, mode) run as the report keeps it, from each rank's epoch statistics
    (:class:`~pytorch_zerocopy.pipeline.EpochStats`; the last epoch is the timed one) and the
    run's wall time; plain values only."""
    ranks = []
    for rank, epochs in sorted(results.items()):
        last = epochs[-1]
        per_mb = last.steady_seconds / last.steady_batches
        ranks.append({"rank": rank, "epoch_seconds": per_mb * last.train_batches,
                      "minibatches": last.train_batches, "ms_per_minibatch": per_mb * 1e3,
                      "feature_bytes_per_s": last.steady_bytes / last.steady_seconds,
                      "input_wait_share": last.input_wait_share,
                      "val_acc": last.val_acc, "loss": last.loss, "partition": _partition(last.partition),
                      "param_checksum": last.param_checksum, "trace": asdict(last.trace) if last.trace else None,
                      "train_step": last.train_step})
    epoch = max(r["epoch_seconds"] for r in ranks)
    return {"gpus": gpus, "mode": mode, "epoch_seconds": epoch, "minibatches": sum(r["minibatches"] for r in ranks),
            "minibatches_per_s": sum(r["minibatches"] for r in ranks) / epoch,
            "feature_gbs": sum(r["feature_bytes_per_s"] for r in ranks) / 1e9,
            "val_acc": ranks[0]["val_acc"], "partition": ranks[0]["partition"], "wall_seconds": wall,
            "input_wait_share": max(r["input_wait_share"] for r in ranks),
            "ranks": ranks}


def _step_label(run: Dict) -> str:
    """How a run's training steps ran: eager, or graphed with its eager fallbacks over all ranks."""
    steps = [k.get("train_step") or {} for k in run["ranks"]]
    if not steps or steps[0].get("kind") != "cuda-graph":
        return steps[0].get("kind", "-") if steps else "-"
    return f"graph, {sum(s.get('fallbacks', 0) for s in steps)} eager"


@dataclass
class ScalingSummary:
    """Per (GPU count, mode): the epoch time of each round (``per_round``) and their median
    (``medians``, what the bars and the vs columns use); the bars."""

    per_round: Dict[Tuple[int, str], List[float]]
    medians: Dict[Tuple[int, str], float]
    bars: Dict[str, Any]


def summarise(runs: List[Dict[str, Any]], gpu_counts: List[int], modes: List[str]) -> ScalingSummary:
    """The medians and bars of ``runs`` (:func:`run_record` records, or ``{"gpus", "mode",
    "error"}`` for a run that failed, which counts nowhere)."""
    wanted = max(gpu_counts)
    per_round: Dict[Tuple[int, str], List[float]] = {}
    for r in runs:
        if "error" not in r:
            per_round.setdefault((r["gpus"], r["mode"]), []).append(r["epoch_seconds"])
    ok = {key: statistics.median(times) for key, times in per_round.items()}
    bars: Dict[str, Any] = {}
    for g in gpu_counts:
        if (g, "zerocopy") in ok and (g, "dma") in ok:
            bars[f"zerocopy_over_dma_{g}gpu"] = ok[(g, "dma")] / ok[(g, "zerocopy")]
    if (wanted, "zerocopy") in ok and (wanted, "dma") in ok:
        bars[f"zerocopy_at_least_{BAR_OVER_DMA}x_dma_on_{wanted}gpu"] = bars[f"zerocopy_over_dma_{wanted}gpu"] >= BAR_OVER_DMA
    for mode in modes:
        if (1, mode) in ok and (wanted, mode) in ok and wanted > 1:
            bars[f"{mode}_{wanted}gpu_over_1gpu"] = ok[(1, mode)] / ok[(wanted, mode)]
    if wanted == 2 and "zerocopy_2gpu_over_1gpu" in bars:
        bars[f"zerocopy_2gpu_at_least_{BAR_SCALING}x_1gpu"] = bars["zerocopy_2gpu_over_1gpu"] >= BAR_SCALING
    return ScalingSummary(per_round, ok, bars)


def report_lines(runs: List[Dict[str, Any]], summary: ScalingSummary, repeats: int, trace: bool) -> List[str]:
    """The report's tables (medians when ``repeats`` > 1, then every run), its per-rank traces
    (``trace``) and its bars, as Markdown lines."""
    ok, per_round, bars = summary.medians, summary.per_round, summary.bars
    md: List[str] = []
    if repeats > 1:
        md += [f"Median of {repeats} rounds (each round runs every GPU count and mode once, in this order); "
               "the vs columns and the bars divide medians.", "",
               "| GPUs | mode | median epoch s | epoch s per round | vs dma | vs 1 GPU |", "|---|---|---|---|---|---|"]
        for (g, mode), median in ok.items():
            dma, one = ok.get((g, "dma")), ok.get((1, mode))
            rounds = " / ".join(f"{x:.3f}" for x in per_round[(g, mode)])
            md.append(f"| {g} | {mode} | {median:.3f} | {rounds} | "
                      + (f"{dma / median:.2f}x" if dma else "-") + " | "
                      + (f"{one / median:.2f}x" if one else "-") + " |")
        md += ["", "Every run:", ""]
    md += ["| round | GPUs | mode | epoch s | minibatches/s | feature GB/s (all GPUs) | vs dma | vs 1 GPU | "
           "partition | input wait | step | val acc |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            md.append(f"| {r['repeat']} | {r['gpus']} | {r['mode']} | failed: {r['error']} | | | | | | | | |")
            continue
        dma = ok.get((r["gpus"], "dma"))
        one = ok.get((1, r["mode"]))
        vs_dma = f"{dma / r['epoch_seconds']:.2f}x" if dma else "-"
        vs_one = f"{one / r['epoch_seconds']:.2f}x" if one else "-"
        part = r["partition"] or {}
        part_s = part.get("kind", "-") + (" (one shared daemon)" if part.get("shared_daemon") else "")
        md.append(f"| {r['repeat']} | {r['gpus']} | {r['mode']} | {r['epoch_seconds']:.3f} | "
                  f"{r['minibatches_per_s']:.1f} | "
                  f"{r['feature_gbs']:.1f} | {vs_dma} | {vs_one} | {part_s} | {r['input_wait_share']:.0%} | "
                  f"{_step_label(r)} | {r['val_acc']:.3f} |")
    if trace:
        def label(r, k):
            prefix = f"round {r['repeat']} " if repeats > 1 else ""
            return f"{prefix}{r['gpus']} GPU(s) {r['mode']} rank {k['rank']}"

        md += [""] + trace_lines([(label(r, k), k.get("trace")) for r in runs if "error" not in r for k in r["ranks"]])
    md += ["", "Bars: " + ", ".join(f"{k} = {v if isinstance(v, bool) else round(v, 3)}" for k, v in bars.items())]
    return md


def run_scaling(args, gpu_counts: List[int], dataset_fn, notes: List[str]) -> int:
    available = torch.cuda.device_count()
    wanted = max(gpu_counts)
    if wanted > available:
        print(f"--gpus asks for {wanted} GPUs, this machine has {available}")
        return 2
    table_gib = args.table_gib or (0.5 if args.quick else 32.0)
    global_batches = args.max_batches or (8 if args.quick else 48)
    if global_batches % wanted:
        global_batches += wanted - global_batches % wanted
    modes = [m for m in args.modes.split(",") if m in SCALING_MODES] or list(SCALING_MODES)
    t_start = time.perf_counter()
    info = machine_info()
    info["gpus"] = available
    notes = notes + [f"every GPU count trains the same {global_batches} minibatches per epoch, split evenly "
                     "between the ranks; epoch time = the slowest rank's steady-state time per minibatch "
                     "x its minibatches",
                     "one pipeline (sampler, producer, consumer) per GPU, one shared host copy of the dataset; "
                     "zerocopy's MPS partition: one daemon for all GPUs",
                     ("training steps issued op by op, gradients averaged by DDP over NCCL" if args.eager else
                      "training steps replayed from CUDA graphs over padded minibatches, gradients averaged by an "
                      "NCCL all-reduce captured in the graph (pytorch_zerocopy/pipeline/train_step.py); the "
                      "step column counts minibatches too large for the graphs' capacities, trained eagerly"),
                     "input wait: share of the steady-state time a trainer spent blocked on its next minibatch "
                     "(the largest over the ranks)"]
    print("\n".join(notes), flush=True)
    print(f"data-parallel scaling: table {table_gib:g} GiB, width {args.width}, GPUs {gpu_counts}", flush=True)
    ds, gen_s = dataset_fn(table_gib, args.width, args)
    ds.share_memory_()
    ceilings = measure_ceilings(ds.features, rows=args.batch_size * 100)
    print(f"  ceilings (GPU 0): {ceilings}", flush=True)
    repeats = args.repeats
    runs = []
    for rep in range(repeats):
        for g in gpu_counts:
            for mode in modes:
                try:
                    r = _run(ds, g, mode, args, global_batches)
                except Exception as e:  # noqa: BLE001 - report and go on
                    r = {"gpus": g, "mode": mode, "error": str(e).strip().splitlines()[-1][:500]}
                r["repeat"] = rep
                print(f"  round {rep} {g} GPU(s) {mode}: "
                      + (f"{r['epoch_seconds']:.3f} s/epoch, {r['feature_gbs']:.1f} GB/s features"
                         if "error" not in r else f"FAILED {r['error']}"), flush=True)
                runs.append(r)
                gc.collect()
    table_bytes = ds.feature_source.nbytes
    described = ds.describe()
    del ds
    gc.collect()

    summary = summarise(runs, gpu_counts, modes)
    ok, bars = summary.medians, summary.bars
    result = {"machine": info, "notes": notes, "ceilings": ceilings,
              "dataset": described, "table_bytes": table_bytes, "generation_seconds": gen_s,
              "global_minibatches": global_batches, "runs": runs, "bars": bars, "config": vars(args),
              "wall_seconds": time.perf_counter() - t_start}
    md = header_lines("GraphSAGE data-parallel training: epoch time per mode and GPU count", info, ceilings)
    md += ["Notes: " + "; ".join(notes) + ".", "", f"Dataset: {described}", ""]
    md += report_lines(runs, summary, repeats, args.trace)
    md += ["", f"Wall time {result['wall_seconds']:.0f} s."]

    def plot(plt):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / max(1, len(gpu_counts))
        for i, g in enumerate(gpu_counts):
            xs = [j + i * width for j, m in enumerate(modes) if (g, m) in ok]
            ys = [ok[(g, m)] for m in modes if (g, m) in ok]
            ax.bar(xs, ys, width=width, label=f"{g} GPU(s)")
        ax.set_xticks([j + width * (len(gpu_counts) - 1) / 2 for j in range(len(modes))])
        ax.set_xticklabels(modes)
        ax.set_ylabel(f"epoch time (s), {global_batches} minibatches")
        ax.set_title(f"Data-parallel GraphSAGE, {table_bytes / 2**30:.3g} GiB host feature table")
        ax.legend()

    write_report(args.out, args.name or ("training_gpus_quick" if args.quick else "training_gpus"), result, md, plot)
    print("\n".join(md))
    return 0
