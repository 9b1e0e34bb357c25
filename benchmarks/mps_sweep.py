"""MPS producer-share sweep (the paper's Figure 10).

    python benchmarks/mps_sweep.py           # full: 32 GiB table, ~5-7 minutes
    python benchmarks/mps_sweep.py --quick   # smoke test

For each producer share X in 2.5, 5, 10, 15, 20, 30, 50 % of the GPU's threads (MPS):

1. *Concurrent kernels*: a producer process (share X) gathers random minibatch-sized row sets
   from the unified table with the routed zero-copy gather, while a consumer process (share
   100 - X) trains GraphSAGE on a fixed minibatch held in GPU memory; both start together
   (barrier) and run ``--seconds``. Reported: the producer's gather GB/s, the consumer's
   minibatches/s, and the SMs each client sees.
2. *Pipeline*: ``zerocopy`` training through the real sampler -> producer -> consumer pipeline
   under MPS with that share: minibatch time (``--max-batches`` per epoch, replayed samples).

References in the same run: the pinned-memcpy ceiling, the DMA baseline, the producer alone on
the whole GPU (the full-GPU gather figure) and the consumer alone (its solo rate). Bars: with
the producer on <= 16 SMs, gather >= 90% of the full-GPU figure while the consumer keeps >= 85%
of its solo rate.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.pipeline_common import (header_lines, machine_info, measure_ceilings, run_children,  # noqa: E402
                                        write_report, zerocopy_gather)

SHARES = (2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0)


def producer_bench(features, rows: int, seconds: float, barrier) -> dict:
    """Routed zero-copy gathers of ``rows`` random rows, back to back, for ``seconds``."""
    import torch

    import pytorch_zerocopy as zc

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = zc.to_unified(features)
    gen = torch.Generator(device="cuda").manual_seed(1)
    pool = [torch.randint(0, features.shape[0], (rows,), device="cuda", generator=gen) for _ in range(8)]
    out = zerocopy_gather(table, pool[0])
    torch.cuda.synchronize()
    if barrier is not None:
        barrier.wait(timeout=120)  # the partner failing breaks the barrier instead of hanging
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for idx in pool:
            out = zerocopy_gather(table, idx)
            n += 1
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"sms": sms, "gathers": n, "gbs": n * out.numel() * out.element_size() / elapsed / 1e9,
            "ms_per_gather": elapsed / n * 1e3}


def consumer_bench(ds, fanouts, batch_size: int, hidden: int, seconds: float, barrier) -> dict:
    """GraphSAGE training steps on one fixed minibatch held in GPU memory, for ``seconds``."""
    import torch
    from torch.nn import functional as F

    from pytorch_zerocopy.nn import GraphSAGE
    from pytorch_zerocopy.sampling import sample_layers

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seeds = ds.train_idx[:batch_size]
    blocks = sample_layers(ds.graph, seeds, fanouts, edge_dir="out", seed=0)
    x = ds.features[blocks[0].nodes].to("cuda").float()
    blocks = [b.to("cuda") for b in blocks]
    y = ds.labels[seeds].to("cuda")
    model = GraphSAGE(ds.feature_dim, hidden, ds.num_classes, len(fanouts)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = F.cross_entropy(model(blocks, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if barrier is not None:
        barrier.wait(timeout=120)  # the partner failing breaks the barrier instead of hanging
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(5):
            step()
            n += 1
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"sms": sms, "steps": n, "minibatches_per_s": n / elapsed, "ms_per_minibatch": elapsed / n * 1e3,
            "input_rows": int(inp.numel())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--table-gib", type=float, default=None, help="feature table size (default 32; quick 0.5)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--shares", default=",".join(f"{s:g}" for s in SHARES))
    p.add_argument("--seconds", type=float, default=None, help="length of each concurrent run (default 3; quick 1)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--max-batches", type=int, default=None, help="pipeline minibatches per epoch (default 30; quick 5)")
    p.add_argument("--no-pipeline", action="store_true", help="skip the end-to-end pipeline runs")
    args = p.parse_args()
    import torch

    from pytorch_zerocopy.datasets import papers_like
    from pytorch_zerocopy.pipeline.partition import MpsDaemon

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure", file=sys.stderr)
        return 2
    q = args.quick
    table_gib = args.table_gib or (0.5 if q else 32.0)
    seconds = args.seconds or (1.0 if q else 3.0)
    max_batches = args.max_batches or (5 if q else 30)
    shares = [float(s) for s in args.shares.split(",")]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    t0 = time.perf_counter()
    info = machine_info()

    nodes = int(table_gib * 2**30 // (args.width * 4))
    ds = papers_like(nodes, feature_dim=args.width, train_fraction=0.01)
    print(f"{ds.describe()} in {time.perf_counter() - t0:.1f} s", flush=True)
    # A minibatch's input rows: as many as the consumer's minibatch has.
    from pytorch_zerocopy.sampling import sample_layers

    rows = sample_layers(ds.graph, ds.train_idx[:args.batch_size], fanouts, edge_dir="out", seed=0)[0].num_src
    ceilings = measure_ceilings(ds.features, rows)
    print(f"ceilings: {ceilings}; {rows} rows per minibatch", flush=True)

    solo_nomps = run_children([(producer_bench, (ds.features, rows, seconds, None), None)])[0]
    concurrent, failed = [], []
    with MpsDaemon() as daemon:
        full_gather = run_children([(producer_bench, (ds.features, rows, seconds, None), daemon.client_env(100))])[0]
        solo_consumer = run_children([(consumer_bench, (ds, fanouts, args.batch_size, args.hidden, seconds, None),
                                       daemon.client_env(100))])[0]
        print(f"full GPU: gather {full_gather['gbs']:.1f} GB/s ({full_gather['sms']} SMs); consumer alone "
              f"{solo_consumer['minibatches_per_s']:.1f} minibatches/s", flush=True)
        import torch.multiprocessing as mp

        for share in shares:
            barrier = mp.get_context("spawn").Barrier(2)
            try:
                prod, cons = run_children([
                    (producer_bench, (ds.features, rows, seconds, barrier), daemon.client_env(share)),
                    (consumer_bench, (ds, fanouts, args.batch_size, args.hidden, seconds, barrier),
                     daemon.client_env(100 - share)),
                ], timeout=300)
            except (RuntimeError, TimeoutError) as e:
                print(f"share {share:g}%: FAILED {e}", flush=True)
                failed.append({"share": share, "error": str(e)[-800:]})
                continue
            row = {"share": share, "producer_sms": prod["sms"], "consumer_sms": cons["sms"],
                   "gather_gbs": prod["gbs"], "gather_vs_full": prod["gbs"] / full_gather["gbs"],
                   "consumer_minibatches_per_s": cons["minibatches_per_s"],
                   "consumer_vs_solo": cons["minibatches_per_s"] / solo_consumer["minibatches_per_s"],
                   "consumer_ms_per_minibatch": cons["ms_per_minibatch"]}
            print(f"share {share:g}%: producer {prod['sms']} SMs {prod['gbs']:.1f} GB/s "
                  f"({row['gather_vs_full']:.0%} of full), consumer {cons['sms']} SMs "
                  f"{cons['minibatches_per_s']:.1f}/s ({row['consumer_vs_solo']:.0%} of solo)", flush=True)
            concurrent.append(row)

    pipeline = []
    if not args.no_pipeline:
        from pytorch_zerocopy.train import train

        for share in [None] + shares:
            kw = dict(fanouts=fanouts, batch_size=args.batch_size, epochs=2, max_batches=max_batches, quiet=True,
                      replay=8, val_batches=1, hidden=args.hidden)
            try:
                if share is None:
                    eps = train(ds, mode="zerocopy", partition="none", **kw)
                else:
                    eps = train(ds, mode="zerocopy", partition="mps", producer_share=share, **kw)
                last = eps[-1]
                secs, n, nbytes = ((last.steady_seconds, last.steady_batches, last.steady_bytes)
                                   if last.steady_batches >= 1 else
                                   (last.train_seconds, last.train_batches, last.feature_bytes))
                row = {"share": share, "ms_per_minibatch": secs / n * 1e3, "feature_gbs": nbytes / secs / 1e9}
            except Exception as e:  # noqa: BLE001
                row = {"share": share, "error": str(e).splitlines()[-1][:300]}
            print(f"pipeline, share {share if share is not None else 'none (no MPS)'}: {row}", flush=True)
            pipeline.append(row)
    del ds
    gc.collect()

    qualifying = [r for r in concurrent if r["producer_sms"] <= 16]
    best = max(qualifying, key=lambda r: min(r["gather_vs_full"] / 0.9, r["consumer_vs_solo"] / 0.85), default=None)
    bars = {}
    if best is not None:
        bars = {"share": best["share"], "producer_sms": best["producer_sms"],
                "gather_vs_full": best["gather_vs_full"], "consumer_vs_solo": best["consumer_vs_solo"],
                "gather_at_least_90pct": best["gather_vs_full"] >= 0.9,
                "consumer_at_least_85pct": best["consumer_vs_solo"] >= 0.85}
    result = {"machine": info, "ceilings": ceilings, "rows_per_minibatch": rows, "table_gib": table_gib,
              "seconds_per_run": seconds, "gather_alone_no_mps": solo_nomps, "gather_alone_mps_100": full_gather,
              "consumer_alone_mps_100": solo_consumer, "concurrent": concurrent, "failed_shares": failed, "pipeline": pipeline, "bars": bars,
              "config": vars(args), "wall_seconds": time.perf_counter() - t0}

    md = header_lines("MPS producer-share sweep (Figure 10)", info, ceilings)
    md += [f"Table {table_gib:g} GiB, width {args.width}; {rows} rows per gather (one minibatch's input nodes); "
           f"{seconds:g} s per concurrent run; pipeline runs: {max_batches} minibatches per epoch, replayed samples.",
           "",
           f"Producer alone: {solo_nomps['gbs']:.1f} GB/s without MPS, {full_gather['gbs']:.1f} GB/s under MPS at 100% "
           f"({full_gather['gbs'] / ceilings['pinned_memcpy_gbs']:.2f} x pinned memcpy). Consumer alone: "
           f"{solo_consumer['minibatches_per_s']:.1f} minibatches/s.", "",
           "| producer share | producer SMs | gather GB/s | vs full GPU | x memcpy | consumer SMs | consumer mb/s | vs solo | pipeline ms/minibatch |",
           "|---|---|---|---|---|---|---|---|---|"]
    pipe = {r["share"]: r for r in pipeline}
    for r in concurrent:
        pr = pipe.get(r["share"], {})
        pms = f"{pr['ms_per_minibatch']:.2f}" if "ms_per_minibatch" in pr else pr.get("error", "-")
        md.append(f"| {r['share']:g}% | {r['producer_sms']} | {r['gather_gbs']:.1f} | {r['gather_vs_full']:.0%} | "
                  f"{r['gather_gbs'] / ceilings['pinned_memcpy_gbs']:.2f} | {r['consumer_sms']} | "
                  f"{r['consumer_minibatches_per_s']:.1f} | {r['consumer_vs_solo']:.0%} | {pms} |")
    for r in failed:
        md.append(f"| {r['share']:g}% | failed: {r['error'].splitlines()[-1][:200]} | | | | | | | |")
    if None in pipe and "ms_per_minibatch" in pipe[None]:
        md += ["", f"Pipeline without MPS (partition none): {pipe[None]['ms_per_minibatch']:.2f} ms per minibatch."]
    md += ["", "Bars (best share with <= 16 producer SMs): " + ", ".join(
        f"{k} = {round(v, 3) if isinstance(v, float) else v}" for k, v in bars.items()), "",
           f"Wall time {result['wall_seconds']:.0f} s."]

    def plot(plt):
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
        xs = [r["share"] for r in concurrent]
        ax[0].plot(xs, [r["gather_gbs"] for r in concurrent], marker="o", label="zero-copy gather (concurrent)")
        ax[0].axhline(full_gather["gbs"], color="gray", ls="--", label="gather alone, full GPU")
        ax[0].axhline(ceilings["pinned_memcpy_gbs"], color="black", ls=":", label="pinned memcpy")
        ax[0].set_xlabel("producer share (%)")
        ax[0].set_ylabel("GB/s")
        ax[0].legend()
        ax[1].plot(xs, [r["consumer_ms_per_minibatch"] for r in concurrent], marker="o", label="consumer (concurrent)")
        pts = [(r["share"], r["ms_per_minibatch"]) for r in pipeline if r["share"] is not None and "ms_per_minibatch" in r]
        if pts:
            ax[1].plot(*zip(*pts), marker="s", label="pipeline")
        ax[1].set_xlabel("producer share (%)")
        ax[1].set_ylabel("ms per minibatch")
        ax[1].legend()

    write_report(args.out, "mps_sweep_quick" if q else "mps_sweep", result, md, plot)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
