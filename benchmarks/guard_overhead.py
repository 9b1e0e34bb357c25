"""What the traversal kernels' bounds checks cost BFS: this tree against itself without them.

    python benchmarks/guard_overhead.py [--unguarded DIR]

The baseline is this same tree built with ``ZEROCOPY_UNGUARDED_TRAVERSAL=1`` (setup.py), which
compiles every check of the traversal kernels (``GraphGuard``, csrc/cuda/traversal_common.cuh)
to "valid": the same kernels, only without the compares. Without ``--unguarded`` the benchmark
copies this tree's sources to a temporary folder, builds that copy in place (``setup.py
build_ext --inplace``, about a minute on 16 cores) and removes it afterwards; ``--unguarded DIR``
names such a build made already. Each side checks its build_info before it runs.

Both builds run the same BFS calls, from the same sources, on the same graphs, saved once by
this process: each build in a process of its own (``PYTHONPATH``), alternating ``--rounds``
times (guarded, unguarded, guarded, ...), so a slow spell of the machine hits both.

Graphs: the symmetric Kronecker graph (``--scale``, edge factor 16; 24 is traversal_peer.py's)
and the 2048 x 2048 grid; placements ``unified`` (the edge list mapped in host memory) and
``cuda``; variants: every BFS variant. A call's time is its wall time up to a device
synchronisation after it (a variant may return before its kernels end), after one untimed call
per (graph, placement, variant).

Bars: ``guard_overhead`` is the largest, over graph x placement, of the median time of the
variant ``auto`` picks over the unguarded build's median for that same variant, minus 1;
``guard_overhead_within_3pct``. Every variant's ratio is reported beside it, with each side's
min and max. The pinned memcpy H2D ceiling of the run is recorded. Where ``traversal_peer.json``
lies in the output folder, measured on the same GPU, its bars are computed again with these two
copied in (``traversal_peer.refresh``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_ENV = "ZEROCOPY_GUARD_BUILD"  # the tree a worker must import the package from
UNGUARDED_ENV = "ZEROCOPY_GUARD_EXPECT_UNGUARDED"  # "1": the worker's build must be the unguarded one
UNGUARDED_FLAG = "ZEROCOPY_UNGUARDED_TRAVERSAL"  # setup.py's switch
SOURCES = ("csrc", "pytorch_zerocopy", "setup.py", "pyproject.toml", "README.md")

BAR = 0.03
VARIANTS = ("frontier", "merged", "aligned", "direction", "async")
PLACEMENTS = ("unified", "cuda")


def _worker(spec_path: str) -> None:
    """One build's timings of every (graph, placement, variant) in ``spec_path``: one JSON line."""
    import pytorch_zerocopy
    from pytorch_zerocopy.graph import CSRGraph
    from pytorch_zerocopy.graph.traversal import bfs

    root = os.environ[BUILD_ENV]
    if not os.path.abspath(pytorch_zerocopy.__file__).startswith(root + os.sep):
        raise RuntimeError(f"imported {pytorch_zerocopy.__file__}, not the build at {root}")
    want = os.environ[UNGUARDED_ENV] == "1"
    if bool(pytorch_zerocopy.build_info().get("unguarded_traversal")) != want:
        raise RuntimeError(f"the build at {root} is {'not ' if want else ''}the unguarded one")
    with open(spec_path) as f:
        spec = json.load(f)
    out: List[Dict[str, Any]] = []
    for graph in spec["graphs"]:
        saved = torch.load(graph["path"], weights_only=True)
        host = CSRGraph(saved["indptr"], saved["indices"], symmetric=True, validate=False)
        for placement in PLACEMENTS:
            g = host.to(placement)
            for variant in graph["variants"]:
                bfs(g, graph["sources"][0], variant=variant)
                torch.cuda.synchronize()
                times = []
                for _ in range(spec["reps"]):
                    for s in graph["sources"]:
                        start = time.perf_counter()
                        bfs(g, s, variant=variant)
                        torch.cuda.synchronize()  # a variant may return before its kernels end
                        times.append((time.perf_counter() - start) * 1e3)
                out.append({"graph": graph["name"], "placement": placement, "variant": variant, "ms": times})
            del g
            torch.cuda.empty_cache()
    print("RESULT " + json.dumps(out), flush=True)


def _graphs(scale: int, workdir: str) -> List[Dict[str, Any]]:
    from pytorch_zerocopy.graph.generators import grid_graph, kronecker_graph
    from pytorch_zerocopy.graph.traversal import auto_variant

    made = [(f"kron{scale}", kronecker_graph(scale, 16, seed=1, device="cuda")), ("grid2048", grid_graph(2048, 2048))]
    graphs = []
    for name, g in made:
        g = g.to("cpu")
        degrees = g.indptr[1:] - g.indptr[:-1]
        sources = [int(v) for v in torch.nonzero(degrees > 0).flatten()[torch.tensor([0, 1000, 100000])].tolist()]
        path = os.path.join(workdir, f"{name}.pt")
        torch.save({"indptr": g.indptr, "indices": g.indices}, path)
        auto = {p: auto_variant("bfs", g.to(p)) for p in PLACEMENTS}
        graphs.append({"name": name, "path": path, "sources": sources, "variants": list(VARIANTS), "auto": auto,
                       "num_nodes": g.num_nodes, "num_edges": g.num_edges})
        del g
        torch.cuda.empty_cache()
    return graphs


def build_unguarded(workdir: str) -> str:
    """A copy of this tree's sources under ``workdir``, built in place without the guards."""
    root = os.path.join(workdir, "unguarded")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "_build_info.py")
    for name in SOURCES:
        src, dst = os.path.join(ROOT, name), os.path.join(root, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=ignore)
        else:
            os.makedirs(root, exist_ok=True)
            shutil.copy2(src, dst)
    env = dict(os.environ, **{UNGUARDED_FLAG: "1", "FORCE_CUDA": "1"})
    if "TORCH_CUDA_ARCH_LIST" not in env:
        major, minor = torch.cuda.get_device_capability()
        env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the unguarded copy failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    print(f"unguarded build at {root} in {time.perf_counter() - t0:.0f} s", flush=True)
    return root


def _run_build(root: str, spec_path: str, unguarded: bool) -> List[Dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=root, **{BUILD_ENV: root, UNGUARDED_ENV: "1" if unguarded else "0"})
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_path], env=env,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the build at {root} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--unguarded", help=f"a copy of this tree built in place with {UNGUARDED_FLAG}=1 "
                                        "(default: build one in a temporary folder)")
    p.add_argument("--scale", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="calls per source and round")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.worker)
        return 0
    if not torch.cuda.is_available():
        p.error("needs a GPU")
    sys.path.insert(0, ROOT)
    from benchmarks.common import environment, pinned_memcpy_gbs
    from benchmarks.traversal_peer import refresh

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zc-guard-") as workdir:
        unguarded = os.path.abspath(args.unguarded) if args.unguarded else build_unguarded(workdir)
        builds = {"guarded": ROOT, "unguarded": unguarded}
        graphs = _graphs(args.scale, workdir)
        spec_path = os.path.join(workdir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump({"graphs": graphs, "reps": args.reps}, f)
        ceiling = pinned_memcpy_gbs()
        times: Dict[tuple, Dict[str, List[float]]] = {}
        for rnd in range(args.rounds):
            for build, root in builds.items():
                for r in _run_build(root, spec_path, unguarded=build == "unguarded"):
                    key = (r["graph"], r["placement"], r["variant"])
                    times.setdefault(key, {}).setdefault(build, []).extend(r["ms"])
                print(f"round {rnd}: {build} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for (graph, placement, variant), by in sorted(times.items()):
        med = {b: statistics.median(v) for b, v in by.items()}
        rows.append({"graph": graph, "placement": placement, "variant": variant,
                     **{f"{b}_ms": med[b] for b in builds}, **{f"{b}_min_ms": min(by[b]) for b in builds},
                     **{f"{b}_max_ms": max(by[b]) for b in builds}, "n": len(by["guarded"]),
                     "overhead": med["guarded"] / med["unguarded"] - 1})
    auto_rows = [r for r in rows for g in graphs
                 if r["graph"] == g["name"] and r["variant"] == g["auto"][r["placement"]]]
    worst = max(auto_rows, key=lambda r: r["overhead"])
    bars = {"guard_overhead": worst["overhead"], "guard_overhead_within_3pct": worst["overhead"] <= BAR}
    result = {"environment": environment(), "ceiling_pinned_memcpy_gbs": ceiling, "graphs": graphs, "rows": rows,
              "bars": bars, "worst": worst, "rounds": args.rounds, "reps": args.reps,
              "wall_seconds": time.perf_counter() - t0}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "guard_overhead.json"), "w") as f:
        json.dump(result, f, indent=1)
    env = result["environment"]
    md = ["# What the traversal kernels' bounds checks cost BFS", "",
          f"{env['gpu']} · driver {env['driver']} · torch {env['torch']} · {env['date']} · pinned memcpy H2D "
          f"{ceiling:.1f} GB/s", "",
          f"Guarded: this tree. Unguarded: the same tree built with {UNGUARDED_FLAG}=1 (its checks "
          "compiled out). Each build in "
          f"its own process, {args.rounds} alternating rounds x {args.reps} calls per source; ms = median of a "
          "call's wall time (min..max beside it).", "",
          "| graph | placement | variant | auto here | guarded ms | unguarded ms | overhead |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        auto = next(g["auto"][r["placement"]] for g in graphs if g["name"] == r["graph"]) == r["variant"]
        md.append(f"| {r['graph']} | {r['placement']} | {r['variant']} | {'yes' if auto else ''} | "
                  f"{r['guarded_ms']:.2f} ({r['guarded_min_ms']:.2f}..{r['guarded_max_ms']:.2f}) | "
                  f"{r['unguarded_ms']:.2f} ({r['unguarded_min_ms']:.2f}..{r['unguarded_max_ms']:.2f}) | "
                  f"{r['overhead']:+.1%} |")
    md += ["", f"Bars: guard_overhead = {bars['guard_overhead']:+.2%} ({worst['graph']}, {worst['placement']}, "
               f"{worst['variant']}: the variant auto picks, worst over graph x placement), "
               f"guard_overhead_within_3pct = {bars['guard_overhead_within_3pct']}", ""]
    with open(os.path.join(args.out, "guard_overhead.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    peer = os.path.join(args.out, "traversal_peer")
    if os.path.exists(peer + ".json"):
        copied = {k: v for k, v in refresh(peer).items() if k.startswith("guard_overhead")}
        print(f"{peer}.json: bars computed again: {copied or 'measured on another GPU: guard bars not copied'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
