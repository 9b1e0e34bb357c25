"""One minibatch per call: feature gathers for freshly sampled GraphSAGE minibatches from a
papers100M-like power-law graph, through the zero-copy op, a GPU cache of hot rows, and node
reordering, against the copy ceiling and the DMA path.

Data. ``graph.power_law_graph(2**26, 15)`` (Pareto list lengths, popularity-skewed entries, hot
nodes spread over the ids) sampled on the GPU from host memory; a float32 feature table of
2**26 x 128 (512 B rows, 32 GiB, unified, random bytes written by the GPU; ``--widths`` adds
wider views of a larger table). Minibatches: 1024 seeds drawn from a 1% training set, fanouts
(15, 10) (``--fanouts`` adds others), sampled with ``sampling.sample_layers``; each timed call
gathers the input nodes (``blocks[0].nodes``) of a minibatch no earlier call has gathered.

Settings, per fanouts and width, all in one run:

* ``memcpy``: pinned cudaMemcpy H2D (the ceiling; measured at start and end);
* ``dma``: the DMA path, CPU ``index_select`` with every core into pinned memory, then a copy;
* ``default``: the reader a plan uses with no cache: a ``FeatureTable`` in the host memory kind
  this machine's GPU reads fastest (measured by ``pytorch_zerocopy.probe``; the bar);
* ``zerocopy`` / ``zerocopy managed``: ``FeatureTable`` reads from the shared table mapped in
  place (``unified``) and from a copy of it in managed memory kept in host memory;
* ``cache``: a ``CachedTable`` (``gather_rows_cached``) in front of each, with ``--cache-fractions``
  of the rows in GPU memory, chosen by degree (how many neighbour lists hold a node) or by
  pre-sampling (how often 256 pre-sampled minibatches read it, GNNLab): labelled settings;
* ``--reorders degree,presample``: each of the above with nodes renumbered hottest first by the
  same score (``graph.reorder``). The table holds random bytes, so a renumbered table is realised
  by renumbering the ids read from the same bytes: the op reads exactly the addresses a
  physically permuted table would give. (``--quick`` checks that equivalence against
  ``NodeOrder.rows``.)
* ``gpu``: the 512 B table in GPU memory (the upper bound; 128 features only).

Metrics: effective bandwidth = feature bytes delivered / time (a cache can exceed the link),
its ratio to memcpy and to the DMA path, hit rate, and the distinct 64 KiB host regions the
misses touch. Times: CUDA events around each call (wall clock + sync for the DMA path), median
over the timed minibatches after warm-up ones.

    python benchmarks/gather_minibatch.py --out $OUT   # ~2 minutes on an H100/H200 (data included)
    python benchmarks/gather_minibatch.py --quick      # seconds, on the CPU (smoke test)

Writes gather_minibatch.json (top-level "bars") and gather_minibatch.md under --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.pipeline_common import write_report  # noqa: E402
from pytorch_zerocopy import hotness  # noqa: E402
from pytorch_zerocopy import unified as _unified  # noqa: E402
from pytorch_zerocopy.feature_table import FeatureTable  # noqa: E402
from pytorch_zerocopy.placement import Placement  # noqa: E402
from pytorch_zerocopy.graph import NodeOrder, power_law_graph  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph  # noqa: E402
from pytorch_zerocopy.sampling import sample_layers  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
BAR_FANOUTS = (15, 10)
BAR_WIDTH = 128
BARS = {"default_512B_vs_memcpy": 0.8}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes-log2", type=int, default=26)
    p.add_argument("--avg-degree", type=float, default=15.0)
    p.add_argument("--widths", default="128", help="float32 features per row")
    p.add_argument("--fanouts", default="15,10", help="';'-separated fanout lists (input side first)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--train-fraction", type=float, default=0.01)
    p.add_argument("--batches", type=int, default=24, help="timed minibatches per setting (each gathered once)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--presample-batches", type=int, default=256)
    p.add_argument("--cache-fractions", default="0.1")
    p.add_argument("--reorders", default="", help="renumberings to add: degree, presample (comma-separated)")
    p.add_argument("--quick", action="store_true", help="a small graph on the CPU in seconds (smoke test)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if args.quick:
        args.nodes_log2, args.batches, args.warmup, args.presample_batches = 13, 3, 1, 8
        args.batch_size, args.fanouts, args.cache_fractions, args.reorders = 128, "15,10", "0.1", "degree"
    return args


class Clock:
    """Median seconds of fn(x) over inputs, after warm-up inputs: CUDA events on a GPU, wall
    clock (+ device sync) for work that starts on the CPU."""

    def __init__(self, gpu: bool, warmup: int):
        self.gpu, self.warmup = gpu, warmup

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def events(self, fn: Callable, inputs: Sequence) -> float:
        if not self.gpu:
            return self.wall(fn, inputs)
        for x in inputs[: self.warmup]:
            fn(x)
        self.sync()
        times = []
        for x in inputs[self.warmup:]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    def wall(self, fn: Callable, inputs: Sequence) -> float:
        for x in inputs[: self.warmup]:
            fn(x)
        self.sync()
        times = []
        for x in inputs[self.warmup:]:
            t0 = time.perf_counter()
            fn(x)
            self.sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def fill_random(dst_u8: torch.Tensor, gpu: bool, seed: int) -> None:
    """Random bytes into a byte view of the table, made on the GPU when there is one."""
    gen = torch.Generator(device="cuda" if gpu else "cpu").manual_seed(seed)
    step = 256 * MiB
    for a in range(0, dst_u8.numel(), step):
        b = min(dst_u8.numel(), a + step)
        dst_u8[a:b].copy_(torch.randint(0, 256, (b - a,), dtype=torch.uint8, device=gen.device, generator=gen))
    if gpu:
        torch.cuda.synchronize()


def minibatches(adj: CSRGraph, train: torch.Tensor, fanouts: Sequence[int], batch_size: int, count: int,
                seed: int) -> List[torch.Tensor]:
    """Input node ids of ``count`` minibatches of ``batch_size`` distinct training seeds."""
    gen = torch.Generator().manual_seed(seed)
    order = train[torch.randperm(train.numel(), generator=gen)]
    out = []
    for b in range(count):
        seeds = order[(b * batch_size) % order.numel():][:batch_size]
        out.append(sample_layers(adj, seeds, list(fanouts), edge_dir="out", seed=seed * 7919 + b)[0].nodes)
    return out


def regions_64k(ids: torch.Tensor, row_bytes: int) -> int:
    return int(torch.unique((ids * row_bytes) >> 16).numel())


def main() -> int:
    args = parse_args()
    gpu = torch.cuda.is_available() and zc.gpu_backed()
    if not gpu and not args.quick:
        print("gather_minibatch needs a CUDA GPU and a CUDA build (or --quick for a CPU smoke test)", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    torch.set_num_threads(os.cpu_count() or 1)
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    clock = Clock(gpu, args.warmup)
    widths = [int(w) for w in args.widths.split(",")]
    fanout_sets = [tuple(int(f) for f in s.split(",")) for s in args.fanouts.split(";") if s.strip()]
    fractions = [float(f) for f in args.cache_fractions.split(",")]
    n = 1 << args.nodes_log2
    report: Dict = {"benchmark": "gather_minibatch", "machine": environment(), "quick": args.quick, "gpu": gpu,
                    "nodes": n, "avg_degree": args.avg_degree, "batch_size": args.batch_size,
                    "settings": [], "timing_s": {}}

    # --- ceiling, graph, table ----------------------------------------------------------------
    if gpu:
        ceiling = pinned_memcpy_gbs(256 * MiB, 9)
    else:  # no link to measure: the host's own copy rate stands in (labelled as such)
        src, dst = torch.empty(64 * MiB, dtype=torch.uint8), torch.empty(64 * MiB, dtype=torch.uint8)
        ceiling = 64 * MiB / clock.wall(lambda _: dst.copy_(src), [None] * 6) / 1e9
    report["memcpy_gbps_start"] = ceiling
    print(f"{'pinned memcpy H2D' if gpu else 'host memcpy (no GPU)'}: {ceiling:.1f} GB/s", flush=True)

    t0 = time.perf_counter()
    g = power_law_graph(n, args.avg_degree, seed=1, device=dev)
    report["timing_s"]["graph"] = time.perf_counter() - t0
    report["edges"] = g.num_edges
    if gpu:
        # UVA sampling: the lists stay in host memory.
        adj = CSRGraph(g.indptr.to(dev), zc.to_unified(g.indices), placement="unified", validate=False)
    else:
        adj = g
    print(f"graph: {n:,} nodes, {g.num_edges:,} edges in {report['timing_s']['graph']:.1f} s", flush=True)

    t0 = time.perf_counter()
    wmax = max(widths)
    table_u8 = zc.empty_unified(n * wmax * 4, torch.uint8) if gpu else zc.empty_shared(n * wmax * 4, torch.uint8)
    fill_random(_unified._C.device_alias(table_u8, dev) if gpu else table_u8, gpu, 0)
    host_u8 = table_u8.cpu()
    report["timing_s"]["table"] = time.perf_counter() - t0
    report["table_bytes"] = n * wmax * 4
    print(f"table: {n * wmax * 4 / GiB:.1f} GiB filled in {report['timing_s']['table']:.1f} s", flush=True)

    from pytorch_zerocopy.probe import host_read_rates

    rates = host_read_rates(quiet=False) if gpu else None
    default_kind = rates.fastest if rates is not None else Placement.MAPPED
    report["host_read_rates"] = None if rates is None else rates.__dict__
    num_train = max(args.batch_size, int(n * args.train_fraction))
    train = torch.randperm(n, generator=torch.Generator().manual_seed(5))[:num_train]
    scores = {"degree": hotness.degree_hotness(adj, "out")}
    orders: Dict[str, NodeOrder] = {}

    bars: Dict[str, object] = {}
    for fanouts in fanout_sets:
        t0 = time.perf_counter()
        scores["presample"] = hotness.presample_hotness(adj, train, fanouts, batch_size=args.batch_size,
                                                        num_batches=args.presample_batches, edge_dir="out", seed=11)
        for name, score in scores.items():
            orders[name] = NodeOrder.from_hotness(score)
        batches = minibatches(adj, train, fanouts, args.batch_size, args.warmup + args.batches, seed=23)
        clock.sync()
        report["timing_s"][f"sampling {fanouts}"] = time.perf_counter() - t0
        rows_per_batch = statistics.mean(b.numel() for b in batches)
        print(f"fanouts {fanouts}: {rows_per_batch:,.0f} input rows per minibatch (pre-sampling and sampling "
              f"{report['timing_s'][f'sampling {fanouts}']:.1f} s)", flush=True)
        for width in widths:
            row_bytes = width * 4
            table = table_u8[: n * row_bytes].view(torch.float32).view(n, width)
            host = host_u8[: n * row_bytes].view(torch.float32).view(n, width)
            out = torch.empty(int(max(b.numel() for b in batches)), width, device=dev)
            pinned = torch.empty(out.shape, pin_memory=gpu)

            def record(setting: str, seconds: float, ids: List[torch.Tensor], **extra) -> Dict:
                nbytes = statistics.mean(b.numel() for b in ids[args.warmup:]) * row_bytes
                rec = {"fanouts": list(fanouts), "width": width, "row_bytes": row_bytes, "setting": setting,
                       "reordered": "+reorder(" in setting, "rows_per_call": rows_per_batch, "ms": seconds * 1e3, "gbps": nbytes / seconds / 1e9, **extra}
                rec["vs_memcpy"] = rec["gbps"] / ceiling
                report["settings"].append(rec)
                tail = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
                print(f"  {str(fanouts):<12} {row_bytes:>5} B {setting:<34} {rec['gbps']:7.1f} GB/s "
                      f"{rec['vs_memcpy']:5.2f}x memcpy {rec['ms']:7.3f} ms {tail}", flush=True)
                return rec

            def attempt(label: str, fn: Callable[[], None]) -> None:
                """Runs one setting; a failure is recorded and the run goes on."""
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - one broken setting must not cost the whole run
                    report.setdefault("errors", []).append(f"{label}: {type(e).__name__}: {e}"[:500])
                    print(f"  {label}: FAILED {type(e).__name__}: {e}", flush=True)

            # The uncached rows' sources, one per host memory kind; each cache setting is a
            # with_cache of one of them (the managed copy is made once per width).
            bases = {Placement.MAPPED: FeatureTable(table, Placement.MAPPED)}
            if gpu:
                t0 = time.perf_counter()
                bases[Placement.MANAGED] = FeatureTable(host, Placement.MANAGED)
                report["timing_s"][f"managed copy {fanouts} {row_bytes} B"] = time.perf_counter() - t0
            reorders = [None] + [r for r in args.reorders.split(",") if r]
            for reorder in reorders:
                ids = batches if reorder is None else [orders[reorder].to_new(b) for b in batches]
                suffix = "" if reorder is None else f" +reorder({reorder})"
                cpu_ids = [i.cpu() for i in ids]

                def dma(i: torch.Tensor) -> None:
                    k = i.numel()
                    torch.index_select(host, 0, i, out=pinned[:k])
                    out[:k].copy_(pinned[:k], non_blocking=True)

                dma_rec = record("dma" + suffix, clock.wall(dma, cpu_ids), ids)
                if reorder is None:
                    dma_base = dma_rec
                regions = statistics.mean(regions_64k(i, row_bytes) for i in ids)
                for memory, base in bases.items():
                    tag = "" if memory is Placement.MAPPED else " managed"
                    if memory is default_kind and reorder is None:
                        rec = record(f"default ({memory.value})", clock.events(
                            lambda i, base=base: base.read(i, out[: i.numel()], check_bounds=False), ids), ids,
                            memory=memory.value, hit_rate=0.0, miss_regions_64k=regions)
                        rec["vs_dma"] = rec["gbps"] / dma_rec["gbps"]
                    gather = (lambda i, base=base: base.read(i, out[: i.numel()], check_bounds=False))
                    zc_rec = record("zerocopy" + tag + suffix, clock.events(gather, ids), ids, memory=memory.value,
                                    hit_rate=0.0, miss_regions_64k=regions)
                    zc_rec["vs_dma"] = zc_rec["gbps"] / dma_rec["gbps"]
                    zc_rec["vs_dma_original_layout"] = zc_rec["gbps"] / dma_base["gbps"]
                    policies = ("degree", "presample") if reorder is None else (reorder,)
                    for policy in policies:
                        for frac in [f for f in fractions if f > 0]:
                            def cached_setting(frac=frac, policy=policy, base=base, memory=memory, tag=tag) -> None:
                                count = int(round(frac * n))
                                # Reordered: the hottest rows are new ids 0..count-1, one block of the table.
                                cached = (torch.arange(count) if reorder is not None
                                          else hotness.hottest(scores[policy], count))
                                ft = base.with_cache(cached)
                                hits = statistics.mean(ft.hit_rate(i) for i in ids)
                                miss_regions = statistics.mean(
                                    regions_64k(i[ft.slot_of[i] < 0], row_bytes) for i in ids)
                                rec = record(f"cache {frac:.0%} {policy}" + tag + suffix, clock.events(
                                    lambda i: ft.read(i, out[: i.numel()], check_bounds=False), ids), ids,
                                    memory=memory.value, cache_fraction=frac, policy=policy, hit_rate=hits,
                                    miss_regions_64k=miss_regions)
                                rec["vs_dma"] = rec["gbps"] / dma_rec["gbps"]
                                rec["vs_dma_original_layout"] = rec["gbps"] / dma_base["gbps"]

                            attempt(f"{fanouts} {row_bytes} B cache {frac:.0%} {policy}{tag}{suffix}", cached_setting)
            if gpu and width == BAR_WIDTH:
                def gpu_memory_table() -> None:
                    gpu_table = host.to(dev)
                    record("gpu-memory table", clock.events(
                        lambda i: zc.gather_rows(gpu_table, i, out[: i.numel()], check_bounds=False), batches), batches)

                attempt(f"{fanouts} {row_bytes} B gpu-memory table", gpu_memory_table)
            del out, pinned, bases

    if gpu:
        report["memcpy_gbps_end"] = pinned_memcpy_gbs(256 * MiB, 9)

    # --- bars ---------------------------------------------------------------------------------
    def pick(**want) -> List[Dict]:
        return [r for r in report["settings"] if all(r.get(k) == v for k, v in want.items())]

    at_bar = dict(fanouts=list(BAR_FANOUTS), width=BAR_WIDTH)
    default = pick(setting=f"default ({default_kind.value})", **at_bar)
    if default:
        bars["default_placement"] = default_kind.value
        bars["default_512B_vs_memcpy"] = default[0]["vs_memcpy"]
        bars["default_512B_vs_dma"] = default[0]["vs_dma"]
        bars["default_512B_rows_per_call"] = default[0]["rows_per_call"]
        bars["table_gib"] = report["table_bytes"] / GiB
        for name, target in BARS.items():
            if name in bars:
                bars[f"{name}_met"] = bool(bars[name] >= target)
        labelled = [r for r in pick(**at_bar) if "vs_dma" in r]
        if labelled:  # best of many settings: labelled, never a bar
            best = max(labelled, key=lambda r: r["gbps"])
            report["best_setting"] = {"setting": best["setting"], "vs_memcpy": best["vs_memcpy"]}
    report["bars"] = bars
    report["bar_targets"] = BARS
    report["wall_s"] = time.perf_counter() - t_start

    if args.quick:
        check_reorder_equivalence(host_u8, n, widths[0], orders["degree"], batches[0])

    md = markdown(report, ceiling)
    write_report(args.out, "gather_minibatch" + ("_quick" if args.quick else ""), report, md)
    print("\n".join(md[:12]))
    print(f"wall {report['wall_s']:.0f} s")
    return 0


def check_reorder_equivalence(host_u8: torch.Tensor, n: int, width: int, order: NodeOrder, ids: torch.Tensor) -> None:
    """A physically permuted table read at renumbered ids gives the rows the benchmark's
    renumbered reads of the original bytes stand for (same bytes per node)."""
    table = host_u8[: n * width * 4].view(torch.float32).view(n, width)
    permuted = order.rows(table)
    ids = ids.cpu()
    if not torch.equal(permuted[order.to_new(ids)].view(torch.int32), table[ids].view(torch.int32)):
        raise RuntimeError("reordered table does not hold each node's row at its new id")
    print("reorder equivalence: a permuted table at new ids holds each node's original row", flush=True)


def markdown(report: Dict, ceiling: float) -> List[str]:
    lines = [f"# Minibatch gathers: {report['nodes']:,}-node power-law graph, {report['table_bytes'] / GiB:.0f} GiB "
             "float32 table", "",
             f"{report['machine'].get('gpu') or 'CPU only (quick)'}; "
             f"{'pinned memcpy H2D' if report['gpu'] else 'host memcpy'} {ceiling:.1f} GB/s; batch {report['batch_size']}; every timed call gathers a fresh minibatch; "
             f"median of the timed minibatches.", "", "## Bars", ""]
    for k, v in report["bars"].items():
        lines.append(f"- {k}: {v:.2f}" if isinstance(v, float) else f"- {k}: {v}")
    if "best_setting" in report:
        lines.append(f"- labelled, not a bar: the fastest of all settings is {report['best_setting']['setting']} "
                     f"({report['best_setting']['vs_memcpy']:.2f} x memcpy)")
    lines += ["", "## Settings", "",
              "| fanouts | row B | setting | rows/call | ms | GB/s (effective) | x memcpy | x DMA (same layout) | "
              "hit rate | miss 64 KiB regions |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["settings"]:
        lines.append(f"| {','.join(map(str, r['fanouts']))} | {r['row_bytes']} | {r['setting']} | "
                     f"{r['rows_per_call']:,.0f} | {r['ms']:.3f} | {r['gbps']:.1f} | {r['vs_memcpy']:.2f} | "
                     f"{r.get('vs_dma', float('nan')):.2f} | {r.get('hit_rate', float('nan')):.3f} | "
                     f"{r.get('miss_regions_64k', float('nan')):,.0f} |")
    for err in report.get("errors", []):
        lines.append(f"- FAILED: {err}")
    lines += ["", "Timing (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report["timing_s"].items()),
              f"Wall time {report['wall_s']:.0f} s."]
    return lines


if __name__ == "__main__":
    sys.exit(main())
