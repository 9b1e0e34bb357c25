"""Diagnostic sweep of the async worklist's launch and scheduling knobs (AsyncTuning in
csrc/cuda/traversal_async.cuh, set through PYTORCH_ZEROCOPY_ASYNC_BLOCKS_PER_SM, _MAX_SLEEP_NS
and _CARRY_CHAIN): BFS on a 2048 x 2048 grid (diameter 4094) from two sources, the graph in host
memory (unified) and in GPU memory, against the level-by-level frontier variant; every result
checked against frontier's. Median of 3 runs per setting. Writes OUT/async_tuning.json and
OUT/best.env (the fastest unified setting), then times SSSP async at that setting once.
Its "bars" name the fastest setting; benchmarks/traversal_peer.py measures the variants for the issue.

    python benchmarks/async_tuning.py OUT
"""
import itertools, json, os, sys, time
import torch
from pytorch_zerocopy.graph import grid_graph, bfs, sssp


def main(out: str) -> None:
    g = grid_graph(2048, 2048, weights="int")
    graphs = {"unified": g.to("unified"), "cuda": g.to("cuda")}
    SOURCES = (0, 1048576)
    ref = {s: bfs(graphs["cuda"], s, variant="frontier") for s in SOURCES}
    sref = {s: sssp(graphs["cuda"], s, variant="frontier") for s in SOURCES}

    def timed(fn, reps=3):
        best = []
        for _ in range(reps):
            torch.cuda.synchronize(); t = time.perf_counter(); r = fn(); torch.cuda.synchronize()
            best.append((time.perf_counter() - t) * 1e3)
        return sorted(best)[len(best) // 2], r

    rows = []
    for place, gg in graphs.items():
        for s in SOURCES:
            ms, r = timed(lambda: bfs(gg, s, variant="frontier"))
            rows.append(dict(op="bfs", variant="frontier", place=place, src=s, ms=ms, ok=bool(torch.equal(r, ref[s]))))
            print(rows[-1], flush=True)
    combos = list(itertools.product((4, 2, 1), (8192, 1024, 256, 64), (64, 4096)))
    for bps, sleep, chain in combos:
        os.environ["PYTORCH_ZEROCOPY_ASYNC_BLOCKS_PER_SM"] = str(bps)
        os.environ["PYTORCH_ZEROCOPY_ASYNC_MAX_SLEEP_NS"] = str(sleep)
        os.environ["PYTORCH_ZEROCOPY_ASYNC_CARRY_CHAIN"] = str(chain)
        for place, gg in graphs.items():
            for s in SOURCES:
                ms, r = timed(lambda: bfs(gg, s, variant="async"))
                rows.append(dict(op="bfs", variant="async", bps=bps, sleep=sleep, chain=chain, place=place, src=s, ms=ms,
                                 ok=bool(torch.equal(r, ref[s]))))
                print(rows[-1], flush=True)
    # best unified setting by mean over sources
    def key(r): return (r["bps"], r["sleep"], r["chain"])
    asy = [r for r in rows if r["variant"] == "async" and r["place"] == "unified"]
    means = {}
    for r in asy: means.setdefault(key(r), []).append(r["ms"])
    best = min(means, key=lambda k: sum(means[k]) / len(means[k]))
    print("best", best, sum(means[best]) / 2, flush=True)
    frontier = [r["ms"] for r in rows if r["variant"] == "frontier" and r["place"] == "unified"]
    bars = {"best_blocks_per_sm": best[0], "best_max_sleep_ns": best[1], "best_carry_chain": best[2],
            "grid_bfs_frontier_over_async_unified_at_best": sum(frontier) / sum(means[best]),
            "every_result_matches_frontier": all(r["ok"] for r in rows)}
    json.dump({"benchmark": "async_tuning", "diagnostic": True, "gpu": torch.cuda.get_device_name(), "rows": rows,
               "bars": bars}, open(os.path.join(out, "async_tuning.json"), "w"), indent=1)
    with open(os.path.join(out, "best.env"), "w") as f:
        f.write(f"export PYTORCH_ZEROCOPY_ASYNC_BLOCKS_PER_SM={best[0]} PYTORCH_ZEROCOPY_ASYNC_MAX_SLEEP_NS={best[1]} PYTORCH_ZEROCOPY_ASYNC_CARRY_CHAIN={best[2]}\n")
    # SSSP async at the best setting (bounded: it was pathological)
    for k, v in zip(("BLOCKS_PER_SM", "MAX_SLEEP_NS", "CARRY_CHAIN"), best):
        os.environ["PYTORCH_ZEROCOPY_ASYNC_" + k] = str(v)
    for s in SOURCES[:1]:
        ms, r = timed(lambda: sssp(graphs["unified"], s, variant="frontier"), reps=1)
        print("sssp frontier", ms, flush=True)
        ms, r = timed(lambda: sssp(graphs["unified"], s, variant="async"), reps=1)
        print("sssp async", ms, bool(torch.equal(r, sref[s])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
