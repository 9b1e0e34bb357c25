"""What DistributedDataParallel costs the GraphSAGE training step, per DDP setting.

``benchmarks/training.py --gpus 1,2`` trains with ~2 ms steps whose pace is set by the trainer's
host (issuing the step's kernels), so any host time DDP adds comes straight off the 2-GPU
scaling. This benchmark isolates that cost. Two ranks, one per GPU, each train on one real
sampled minibatch (same fan-outs, batch size and widths as ``training.py``) that already sits
in GPU memory, so nothing but the step is timed. Each variant of the step runs ``--steps`` times
(after a warm-up), three times over; reported: the median wall time per step (the host runs
ahead freely and synchronises once at the end) and the host's mean time to issue one step.

Variants (both ranks run each one at the same time, so host contention is the same):
  local          no DDP: the 1-GPU baseline
  local_aten     local, with the mean aggregation written in ATen ops instead of the fused
                 zerocopy::block_mean (what the model did before)
  ddp_solo       DDP over a one-rank group: DDP's own host cost, no peer to wait for
  ddp            DDP as constructed by default (``device_ids=[gpu]``)
  bucket_view    + ``gradient_as_bucket_view=True`` (gradients live in the all-reduce buckets;
                 the library's setting)
  static         + ``static_graph=True``
  static_aten    static, with the ATen-ops mean aggregation
  no_device_ids  + ``device_ids=None`` (DDP leaves the inputs alone instead of walking them)
  keep_grads     static, with ``zero_grad(set_to_none=False)``
  flat_allreduce no DDP; one all-reduce of the flattened gradients after backward (a floor)
  graphed        no DDP: the library's default step (pytorch_zerocopy/pipeline/train_step.py),
                 replayed from CUDA graphs over the minibatch padded to fixed capacities, the
                 gradient all-reduce captured in the graph (its 3 warm-up steps are part of the
                 benchmark's warm-up); includes the per-step copies into the padded buffers

``--mps`` repeats the set with both ranks as clients of one MPS daemon (as zerocopy's
partition runs them, at 90% of the threads). Each variant also reports the GPU's own time per
step: a spin kernel holds the stream while the host issues 8 steps, which then run back to
back (valid when the host finished issuing before the spin ended: nothing blocked it). The
pinned-memcpy ceiling is recorded as in every benchmark; the baseline here is ``local``.
Results: ``ddp_step.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.pipeline_common import machine_info, run_children, run_in_child, write_report  # noqa: E402
from benchmarks.common import pinned_memcpy_gbs  # noqa: E402

VARIANTS = ("local", "local_aten", "ddp_solo", "ddp", "bucket_view", "static", "static_aten", "no_device_ids",
            "keep_grads", "flat_allreduce", "graphed")
GPU_STEPS = 8  # few enough that their launches fit CUDA's queue (~1000) and never block the host


def _aten_mean(h_src, src, dst, num_dst):
    """The mean aggregation in ATen ops (nine per forward), as the model wrote it before."""
    out = h_src.new_zeros(num_dst, h_src.shape[1])
    out.index_add_(0, dst, h_src.index_select(0, src))
    deg = h_src.new_zeros(num_dst).index_add_(0, dst, h_src.new_ones(dst.numel())).clamp_(min=1)
    return out / deg.unsqueeze(1)


def _gpu_ms_per_step(step, device) -> Dict[str, float]:
    """GPU time per step with the steps queued back to back behind a spin kernel."""
    spin_start, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    spin_start.record()
    torch.cuda._sleep(400_000_000)  # ~0.2 s at H100/H200 clocks: longer than issuing the steps
    start.record()
    t = time.perf_counter()
    for _ in range(GPU_STEPS):
        step()
    issued = time.perf_counter() - t
    end.record()
    torch.cuda.synchronize(device)
    spin_ms = spin_start.elapsed_time(start)
    return {"gpu_ms": start.elapsed_time(end) / GPU_STEPS, "gpu_valid": issued * 1e3 < spin_ms,
            "spin_ms": spin_ms, "issued_ms": issued * 1e3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _minibatch(args, device: torch.device):
    """One sampled minibatch over a uniform random graph, its blocks and inputs on ``device``."""
    from pytorch_zerocopy.graph import CSRGraph
    from pytorch_zerocopy.sampling import sample_layers

    gen = torch.Generator().manual_seed(0)
    n, deg = args.nodes, args.degree
    indptr = torch.arange(n + 1, dtype=torch.int64) * deg
    indices = torch.randint(0, n, (n * deg,), generator=gen)
    seeds = torch.randperm(n, generator=gen)[: args.batch_size]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    blocks = sample_layers(CSRGraph(indptr, indices, validate=False), seeds, fanouts, edge_dir="out", seed=0)
    input_nodes = blocks[0].nodes
    blocks = [b.to(device) for b in blocks]
    for b in blocks:
        b.srcdata.clear()
        b.dstdata.clear()
    feats = torch.randn(input_nodes.numel(), args.feature_dim, generator=gen).to(device)
    labels = torch.randint(0, args.classes, (args.batch_size,), generator=gen).to(device)
    return blocks, feats, labels


def _wrap(variant: str, model, device, solo_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    if variant == "ddp_solo":
        return DDP(model, device_ids=ids, process_group=solo_group)
    if variant == "ddp":
        return DDP(model, device_ids=ids)
    if variant == "bucket_view":
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True)
    if variant in ("static", "static_aten", "keep_grads"):
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True, static_graph=True)
    if variant == "no_device_ids":
        return DDP(model, device_ids=None, gradient_as_bucket_view=True, static_graph=True)
    return model


def _rank_main(rank: int, world: int, port: int, args) -> Dict[str, Dict[str, float]]:
    import torch.distributed as dist
    from pytorch_zerocopy import nn as sage
    from pytorch_zerocopy.nn import GraphSAGE

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    solo = [dist.new_group([r]) for r in range(world)][rank]
    blocks, feats, labels = _minibatch(args, device)
    layers = len(args.fanouts.split(","))

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    out: Dict[str, Dict[str, float]] = {}
    fused_mean = sage.block_mean
    for variant in args.variants.split(","):
        sage.block_mean = _aten_mean if variant.endswith("_aten") else fused_mean
        torch.manual_seed(0)
        model = _wrap(variant, GraphSAGE(args.feature_dim, args.hidden, args.classes, layers, 0.3).to(device),
                      device, solo)
        params = [p for p in model.parameters()]
        set_to_none = variant != "keep_grads"
        graphed, opt = None, None
        if variant == "graphed":  # brings its own capturable Adam over the flat gradients
            from pytorch_zerocopy.pipeline.train_step import GraphedTrainStep

            graphed = GraphedTrainStep(model, 1e-3, device, world_size=world, capture=cuda)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=cuda)

        def step():
            if graphed is not None:
                graphed(blocks, feats, labels)
                return
            loss = F.cross_entropy(model(blocks, feats), labels)
            opt.zero_grad(set_to_none=set_to_none)
            loss.backward()
            if variant == "flat_allreduce":
                grads = [p.grad for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat)
                flat.div_(world)
                parts = flat.split([g.numel() for g in grads])
                torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(parts, grads)])
            opt.step()

        for _ in range(args.warmup):
            step()
        sync()
        walls, issues = [], []
        for _ in range(3):
            dist.barrier()
            sync()
            issue = 0.0
            t0 = time.perf_counter()
            for _ in range(args.steps):
                t = time.perf_counter()
                step()
                issue += time.perf_counter() - t
            sync()
            walls.append((time.perf_counter() - t0) / args.steps * 1e3)
            issues.append(issue / args.steps * 1e3)
        out[variant] = {"step_ms": statistics.median(walls), "issue_ms": statistics.median(issues),
                        "step_ms_runs": walls}
        if cuda:
            dist.barrier()
            out[variant].update(_gpu_ms_per_step(step, device))
        if graphed is not None:
            out[variant]["train_step"] = graphed.summary()
            graphed.close()  # graphs that captured NCCL work must go before the process group
    dist.barrier()
    sizes = {"input_nodes": int(feats.shape[0]), "edges": [int(b.src.numel()) for b in blocks]}
    dist.destroy_process_group()
    return {"variants": out, "minibatch": sizes}


def _gpu_cell(row: Dict) -> str:
    if "gpu_ms" not in row:
        return "-"
    return f"{row['gpu_ms']:.3f}" + ("" if row["gpu_valid"] else " (host blocked)")


def _run_set(args, env: Dict[str, str]) -> List[Dict]:
    port = _free_port()
    return run_children([(_rank_main, (r, 2, port, args), env) for r in range(2)], timeout=args.timeout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--name", default="ddp_step")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--nodes", type=int, default=4 << 20, help="nodes of the random graph sampled from")
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--feature-dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=172)
    p.add_argument("--mps", action="store_true", help="also run every variant under one MPS daemon")
    p.add_argument("--timeout", type=float, default=400)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda and torch.cuda.device_count() < 2:
        print("ddp_step: needs 2 GPUs", file=sys.stderr)
        return 2

    info = machine_info()
    ceiling = run_in_child(pinned_memcpy_gbs) if cuda else float("nan")
    sets = {"plain": _run_set(args, {})}
    if args.mps:
        from pytorch_zerocopy.pipeline.partition import MpsDaemon

        with MpsDaemon() as daemon:
            sets["mps"] = _run_set(args, daemon.client_env(90))

    lines = ["# What DDP costs the GraphSAGE training step (2 ranks, one GPU each)", "",
             f"{info['device']}, driver {info.get('driver')}, torch {info['torch']}, {info['date']}, "
             f"{info['cpu_count']} CPU cores; pinned memcpy H2D ceiling {ceiling:.1f} GB/s", "",
             f"One sampled minibatch in GPU memory (batch {args.batch_size}, fan-outs {args.fanouts}, "
             f"{sets['plain'][0]['minibatch']['input_nodes']:,} input nodes, edges per block "
             f"{sets['plain'][0]['minibatch']['edges']}), {args.feature_dim} -> {args.hidden} -> {args.classes}, "
             f"fused Adam; {args.steps} steps x 3, median. step: wall time per step, host running ahead; "
             "issue: the host's time to issue one step; GPU: the GPU's time per step with the steps queued back "
             "to back ('host blocked': the host could not issue them all while the GPU was held, so the figure "
             "is an upper bound). Both ranks run every variant at once.", ""]
    for name, ranks in sets.items():
        lines += [f"## {name}{' (both ranks MPS clients at 90% of the threads)' if name == 'mps' else ''}", "",
                  "| variant | step ms (rank 0 / 1) | issue ms (rank 0 / 1) | GPU ms per step (rank 0 / 1) "
                  "| step vs local |", "|---|---|---|---|---|"]
        base = max(r["variants"]["local"]["step_ms"] for r in ranks) if "local" in ranks[0]["variants"] else None
        for v in ranks[0]["variants"]:
            step = [r["variants"][v]["step_ms"] for r in ranks]
            issue = [r["variants"][v]["issue_ms"] for r in ranks]
            ratio = f"{max(step) / base:.2f}x" if base else "-"
            gpu = " / ".join(_gpu_cell(r["variants"][v]) for r in ranks)
            lines.append(f"| {v} | {step[0]:.3f} / {step[1]:.3f} | {issue[0]:.3f} / {issue[1]:.3f} | {gpu} | {ratio} |")
        lines.append("")
    write_report(args.out, args.name, {"machine": info, "pinned_memcpy_gbs": ceiling, "args": vars(args),
                                       "sets": sets}, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
