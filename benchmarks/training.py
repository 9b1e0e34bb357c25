"""GraphSAGE epoch time per data path (the paper's Figure 11) and per feature width (Figure 12).

    python benchmarks/training.py            # full: >= 32 GiB feature tables, ~6-8 minutes
    python benchmarks/training.py --quick    # seconds-scale smoke test, small tables
    python benchmarks/training.py --gpus 1,2 # data-parallel scaling per mode (training_gpus.*)

Figure 11: one papers100M-like graph whose feature table holds ``--table-gib`` GiB of host
memory; every mode (cpu, dma, zerocopy-naive, zerocopy, gpu) trains ``--epochs`` epochs of
``--max-batches`` minibatches; the last epoch is timed (the first warms up). Figure 12: the same
table size at each ``--widths`` feature width, dma vs zerocopy (and gpu when it fits).

To fit the time limit, epochs are cut to ``--max-batches`` minibatches and the sampler replays
``--replay`` pre-sampled minibatches (CPU sampling is the same for every mode and is not what
the figures compare); the cpu mode runs ``--cpu-batches`` minibatches and its time is scaled to
``--max-batches``. The output says so. Results: JSON + Markdown (+ PNG) in ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.pipeline_common import header_lines, machine_info, measure_ceilings, trace_lines, write_report  # noqa: E402

MODES = ("cpu", "dma", "zerocopy-naive", "zerocopy", "gpu")


def _run_mode(ds, mode, args, max_batches, partition=None, ring=False, group=None):
    """One training run; ``ring``: the ``gpu`` mode with a producer process gathering from the
    GPU-memory table into the same ring the zerocopy mode uses (label ``gpu[ring]``);
    ``group``: zerocopy with that many minibatches per gather (label ``zerocopy[xN]``)."""
    from pytorch_zerocopy.train import train

    extra = {"trace": True} if args.trace else {}
    extra["cuda_graph"] = not args.eager
    if mode == "zerocopy":
        extra.update(producer_share=args.producer_share, producer_sms=args.producer_sms)
    if ring:
        extra["producer_process"] = True
    if group is not None:
        extra["gather_batches"] = group
    start = time.perf_counter()
    epochs = train(ds, mode=mode, partition=(partition or args.partition) if mode == "zerocopy" else "auto",
                   fanouts=[int(f) for f in args.fanouts.split(",")], batch_size=args.batch_size,
                   epochs=args.epochs, max_batches=max_batches, quiet=True, num_samplers=args.samplers,
                   replay=args.replay, val_batches=1, hidden=args.hidden, **extra)
    wall = time.perf_counter() - start
    last = epochs[-1]
    label = mode if partition is None else f"{mode}[{partition}]"
    if ring:
        label = f"{mode}[ring]"
    if group is not None:
        label = f"{mode}[x{group}]"
    # Epoch time at the steady-state rate: the first minibatch of an epoch carries the
    # pipeline's fill in one mode and a head start in another, so it is left out of the rate.
    if last["steady_batches"] >= 1:
        per_mb = last["steady_seconds"] / last["steady_batches"]
        gbs = last["steady_bytes"] / last["steady_seconds"] / 1e9
    else:
        per_mb = last["train_seconds"] / last["train_batches"]
        gbs = last["feature_bytes"] / last["train_seconds"] / 1e9
    return {"mode": label, "gather_batches": last["gather_batches"] if mode == "zerocopy" else None,
            "epoch_seconds": per_mb * last["train_batches"], "minibatches": last["train_batches"],
            "measured_epoch_seconds": last["train_seconds"], "ms_per_minibatch": per_mb * 1e3,
            "minibatches_per_s": 1.0 / per_mb, "feature_gbs": gbs,
            "loss": last["loss"], "val_acc": last["val_acc"], "wall_seconds": wall,
            "input_wait_share": last.get("steady_wait_seconds", float("nan")) / last["steady_seconds"]
            if last["steady_batches"] >= 1 else float("nan"),
            "trace": last.get("trace"), "all_epochs": epochs}


def _by_mode(runs):
    """One row per mode for the bars: with repeats of a mode, the run with the median epoch
    time (the lower middle one for an even count); ``gpu`` is the faster of ``gpu`` and
    ``gpu[ring]`` when both ran."""
    groups = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault(r["mode"], []).append(r)
    out = {}
    for mode, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["epoch_seconds"])
        out[mode] = rs[(len(rs) - 1) // 2]
    if "gpu[ring]" in out and ("gpu" not in out or out["gpu[ring]"]["epoch_seconds"] < out["gpu"]["epoch_seconds"]):
        out["gpu"] = out["gpu[ring]"]
    return out


def _dataset(table_gib, width, args):
    from pytorch_zerocopy.datasets import papers_like

    nodes = max(10_000, int(table_gib * 2**30 // (width * 4)))
    t = time.perf_counter()
    ds = papers_like(nodes, avg_degree=args.degree, feature_dim=width, train_fraction=0.01)
    gen_s = time.perf_counter() - t
    print(f"  {ds.describe()} generated in {gen_s:.1f} s", flush=True)
    return ds, gen_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--table-gib", type=float, default=None, help="feature table size (default 32; quick 0.5)")
    p.add_argument("--sweep-gib", type=float, default=None, help="table size of the width sweep (default 32; quick 0.5)")
    p.add_argument("--widths", default=None, help="Figure 12 widths (default 128,512,1024,2048,4096)")
    p.add_argument("--width", type=int, default=128, help="Figure 11 feature width")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sweep-modes", default="dma,zerocopy,gpu")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the last is timed")
    p.add_argument("--max-batches", type=int, default=None, help="minibatches per epoch (default 40; quick 6)")
    p.add_argument("--cpu-batches", type=int, default=None, help="minibatches per epoch in cpu mode (default 8)")
    p.add_argument("--replay", type=int, default=8, help="distinct pre-sampled minibatches (0: sample every one)")
    p.add_argument("--samplers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--partition", default="auto", help="zerocopy mode's partition: auto, mps, green, none")
    p.add_argument("--extra-partitions", default="green,none",
                   help="extra Figure 11 rows: zerocopy with these partitions (besides --partition)")
    p.add_argument("--producer-share", type=float, default=10.0)
    p.add_argument("--producer-sms", type=int, default=16)
    p.add_argument("--gather-batches", default="",
                   help="extra Figure 11 rows: zerocopy gathering this many minibatches per call (e.g. 2,4,8)")
    p.add_argument("--gpu-ring", action="store_true",
                   help="also run the gpu mode through the producer/consumer ring (row gpu[ring]); the "
                        "zerocopy-vs-gpu bar then uses the faster of the two gpu rows")
    p.add_argument("--trace", action="store_true",
                   help="record per-minibatch timings (GPU gaps, step and gather times) and tabulate them")
    p.add_argument("--eager", action="store_true",
                   help="training steps issued op by op (DDP with several GPUs), not replayed from CUDA graphs")
    p.add_argument("--name", default=None, help="base name of the result files (default training[_quick|_gpus])")
    p.add_argument("--repeats", type=int, default=1,
                   help="with --gpus: run every (GPU count, mode) this many times, the GPU counts interleaved "
                        "within each round; bars use the median epoch time")
    p.add_argument("--gpus", default="1",
                   help="'1': Figures 11 and 12 on one GPU; a list of GPU counts such as '1,2': data-parallel "
                        "scaling per mode (training_gpus.*) instead")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be a positive count, got {args.repeats}")
    try:
        gpu_counts = sorted({int(g) for g in str(args.gpus).split(",") if g.strip()})
    except ValueError:
        p.error(f"--gpus must be GPU counts separated by commas, got {args.gpus!r}")
    if not gpu_counts or gpu_counts[0] < 1:
        p.error(f"--gpus must be positive GPU counts, got {args.gpus!r}")
    import torch

    if gpu_counts != [1]:
        if not torch.cuda.is_available():
            print("no CUDA GPU: the data-parallel scaling benchmark needs GPUs", file=sys.stderr)
            return 2
        from benchmarks.training_gpus import run_scaling

        notes = [f"{args.epochs} epochs per run, the last timed; sampler replays {args.replay} pre-sampled "
                 "minibatches" if args.replay else f"{args.epochs} epochs per run, the last timed"]
        args.replay = args.replay or None
        return run_scaling(args, gpu_counts, _dataset, notes)

    gpu = torch.cuda.is_available()
    if not gpu and not set(args.modes.split(",")) | set(args.sweep_modes.split(",")) <= {"cpu", "zerocopy", ""}:
        print("no CUDA GPU: this benchmark compares GPU data paths; without one only --modes cpu,zerocopy "
              "--sweep-modes zerocopy run (a smoke test of the CPU pipeline)", file=sys.stderr)
        return 2
    q = args.quick
    table_gib = args.table_gib or (0.5 if q else 32.0)
    sweep_gib = args.sweep_gib or (0.5 if q else 32.0)
    widths = [int(w) for w in (args.widths or ("128,1024" if q else "128,512,1024,2048,4096")).split(",")]
    max_batches = args.max_batches or (6 if q else 40)
    cpu_batches = args.cpu_batches or (2 if q else 8)
    args.replay = args.replay or None
    modes = [m for m in args.modes.split(",") if m]
    t_start = time.perf_counter()
    info = machine_info()
    notes = [f"epochs cut to {max_batches} minibatches (cpu mode: {cpu_batches}, time scaled to {max_batches})",
             "epoch time = steady-state time per minibatch (first minibatch of the epoch excluded) x minibatches",
             f"{args.epochs} epochs per run, the last timed; sampler replays {args.replay} pre-sampled minibatches"
             if args.replay else f"{args.epochs} epochs per run, the last timed; every minibatch sampled",
             "bars and the vs columns use one run per mode: the median of its repeats; the gpu reference is the "
             "faster of gpu and gpu[ring] when both ran",
             "zerocopy: the producer gathers several minibatches per call (pytorch_zerocopy.train."
             "default_gather_batches: 8 for rows up to 512 B, 1 from 4 KiB); zerocopy[xN]: N per call"]
    print("\n".join(notes))

    print(f"Figure 11: table {table_gib:g} GiB, width {args.width}", flush=True)
    if not modes and not args.gather_batches and not args.gpu_ring and not args.extra_partitions:
        # Figure 12 only: its first width's table gives the ceilings.
        ds, gen_s = _dataset(sweep_gib, widths[0], args)
    else:
        ds, gen_s = _dataset(table_gib, args.width, args)
    ceilings = measure_ceilings(ds.features, rows=args.batch_size * 100) if gpu else {}
    print(f"  ceilings: {ceilings}", flush=True)
    fig11 = []
    for mode in modes:
        mb = cpu_batches if mode == "cpu" else max_batches
        try:
            r = _run_mode(ds, mode, args, mb)
            if mode == "cpu":
                r["epoch_seconds_measured"] = r["epoch_seconds"]
                r["epoch_seconds"] = r["epoch_seconds"] * max_batches / max(1, r["minibatches"])
                r["scaled_to_minibatches"] = max_batches
        except Exception as e:  # noqa: BLE001 - report and go on with the other modes
            r = {"mode": mode, "error": str(e).splitlines()[-1][:500]}
        print(f"  {mode}: " + (f"{r['epoch_seconds']:.2f} s/epoch, {r['feature_gbs']:.1f} GB/s features"
                               if "error" not in r else f"FAILED {r['error']}"), flush=True)
        fig11.append(r)
    extra = [(f"zerocopy[{part}]", "zerocopy", {"partition": part}) for part in args.extra_partitions.split(",") if part]
    extra += [(f"zerocopy[x{g}]", "zerocopy", {"group": int(g)}) for g in args.gather_batches.split(",") if g.strip()]
    extra += [("gpu[ring]", "gpu", {"ring": True})] if args.gpu_ring else []
    for label, mode, kw in extra:
        try:
            r = _run_mode(ds, mode, args, max_batches, **kw)
        except Exception as e:  # noqa: BLE001 - report and go on with the other runs
            r = {"mode": label, "error": str(e).splitlines()[-1][:500]}
        print(f"  {r['mode']}: " + (f"{r['epoch_seconds']:.2f} s/epoch, {r['feature_gbs']:.1f} GB/s features"
                                    if "error" not in r else f"FAILED {r['error']}"), flush=True)
        fig11.append(r)
    table_bytes = ds.features.numel() * ds.features.element_size()
    fig11_ds = ds.describe()
    del ds
    gc.collect()

    fig12 = []
    fig11_modes = {r["mode"]: r for r in fig11 if "error" not in r}
    sweep_modes = [m for m in args.sweep_modes.split(",") if m]
    for w in widths:
        print(f"Figure 12: width {w}, table {sweep_gib:g} GiB", flush=True)
        if w == args.width and sweep_gib == table_gib and all(m in fig11_modes for m in sweep_modes):
            # The Figure 11 runs are this point of the sweep: reuse them.
            fig12 += [dict(fig11_modes[m], width=w) for m in sweep_modes]
            print("  (same as Figure 11: reused)", flush=True)
            continue
        ds, _ = _dataset(sweep_gib, w, args)
        for mode in sweep_modes:
            try:
                r = _run_mode(ds, mode, args, max_batches)
            except Exception as e:  # noqa: BLE001
                r = {"mode": mode, "error": str(e).splitlines()[-1][:500]}
            r["width"] = w
            print(f"  {mode}: " + (f"{r['epoch_seconds']:.2f} s/epoch, {r['feature_gbs']:.1f} GB/s"
                                   if "error" not in r else f"FAILED {r['error']}"), flush=True)
            fig12.append(r)
        del ds
        gc.collect()

    by_mode = _by_mode(fig11)
    bars = {}
    if "zerocopy" in by_mode and "gpu" in by_mode:
        bars["zerocopy_over_gpu_epoch_time"] = by_mode["zerocopy"]["epoch_seconds"] / by_mode["gpu"]["epoch_seconds"]
        bars["zerocopy_within_10pct_of_gpu"] = bars["zerocopy_over_gpu_epoch_time"] <= 1.10

    if "zerocopy" in by_mode and "dma" in by_mode:
        bars["zerocopy_speedup_over_dma"] = by_mode["dma"]["epoch_seconds"] / by_mode["zerocopy"]["epoch_seconds"]
        bars["zerocopy_at_least_1.3x_dma"] = bars["zerocopy_speedup_over_dma"] >= 1.3
    for w in widths:
        rows = {r["mode"]: r for r in fig12 if r["width"] == w and "error" not in r}
        if "dma" in rows and "zerocopy" in rows:
            bars[f"width_{w}_zerocopy_speedup_over_dma"] = rows["dma"]["epoch_seconds"] / rows["zerocopy"]["epoch_seconds"]
    result = {"machine": info, "notes": notes, "ceilings": ceilings, "figure11": {
        "dataset": fig11_ds, "table_bytes": table_bytes, "generation_seconds": gen_s, "runs": fig11},
        "figure12": {"table_gib": sweep_gib, "runs": fig12}, "bars": bars,
        "config": vars(args), "wall_seconds": time.perf_counter() - t_start}

    md = header_lines("GraphSAGE training: epoch time per data path (Figure 11) and width (Figure 12)", info, ceilings)
    md += ["Notes: " + "; ".join(notes) + ".", "", f"Figure 11 dataset: {fig11_ds}", "",
           "| mode | epoch s | minibatches/s | feature GB/s | x pinned memcpy | vs dma | vs gpu | val acc |",
           "|---|---|---|---|---|---|---|---|"]
    ceiling = ceilings.get("pinned_memcpy_gbs", float("nan"))
    for r in fig11:
        if "error" in r:
            md.append(f"| {r['mode']} | failed: {r['error']} | | | | | | |")
            continue
        vs_dma = (f"{by_mode['dma']['epoch_seconds'] / r['epoch_seconds']:.2f}x faster" if "dma" in by_mode else "-")
        vs_gpu = (f"{r['epoch_seconds'] / by_mode['gpu']['epoch_seconds']:.2f}x time" if "gpu" in by_mode else "-")
        md.append(f"| {r['mode']} | {r['epoch_seconds']:.3f} | {r['minibatches_per_s']:.1f} | {r['feature_gbs']:.1f} | "
                  f"{r['feature_gbs'] / ceiling:.2f} | {vs_dma} | {vs_gpu} | {r['val_acc']:.3f} |")
    md += ["", "Figure 12 (table %g GiB per width):" % sweep_gib, "",
           "| width | mode | epoch s | feature GB/s | speedup over dma |", "|---|---|---|---|---|"]
    for r in fig12:
        if "error" in r:
            md.append(f"| {r['width']} | {r['mode']} | failed: {r['error']} | | |")
            continue
        dma = next((x for x in fig12 if x["width"] == r["width"] and x["mode"] == "dma" and "error" not in x), None)
        sp = dma["epoch_seconds"] / r["epoch_seconds"] if dma else float("nan")
        md.append(f"| {r['width']} | {r['mode']} | {r['epoch_seconds']:.3f} | {r['feature_gbs']:.1f} | {sp:.2f} |")
    if args.trace:
        md += [""] + trace_lines([(r["mode"], r.get("trace")) for r in fig11 if "error" not in r]
                                 + [(f"{r['mode']}, width {r['width']}", r.get("trace")) for r in fig12
                                    if "error" not in r])
    md += ["", "Bars: " + ", ".join(f"{k} = {v if isinstance(v, bool) else round(v, 3)}" for k, v in bars.items()), "",
           f"Wall time {result['wall_seconds']:.0f} s."]

    def plot(plt):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        ok = [r for r in fig11 if "error" not in r]
        axes[0].bar([r["mode"] for r in ok], [r["epoch_seconds"] for r in ok], color="tab:blue")
        axes[0].set_ylabel("epoch time (s)")
        axes[0].set_title(f"Figure 11: {table_bytes / 2**30:.3g} GiB table, width {args.width}")
        for mode in sweep_modes:
            pts = [(r["width"], r["epoch_seconds"]) for r in fig12 if r["mode"] == mode and "error" not in r]
            if pts:
                axes[1].plot(*zip(*pts), marker="o", label=mode)
        axes[1].set_xscale("log", base=2)
        axes[1].set_xlabel("feature width")
        axes[1].set_ylabel("epoch time (s)")
        axes[1].set_title(f"Figure 12: {sweep_gib:g} GiB tables")
        axes[1].legend()

    write_report(args.out, args.name or ("training_quick" if q else "training"), result, md, plot)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
