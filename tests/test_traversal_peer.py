"""benchmarks/traversal_peer.py and benchmarks/emogi.py on the CPU: EMOGI's printed times parsed,
its command lines, the bars computed from synthetic timings, and a whole quick run beside a
stand-in EMOGI checkout whose programs print what EMOGI's print."""

import json
import os
import stat

import pytest
import torch

from benchmarks import emogi
from benchmarks import traversal_peer as tp
from pytorch_zerocopy.graph import CSRGraph

BFS_OUTPUT = """g.bel
Vertex: 4096, Edge: 123
Allocation finished
Initialization done
run   0: src            0, iteration  11, time     2.500000 ms
run   1: src         2048, iteration   9, time     1.500000 ms
Average run time 2.000000 ms
"""


def test_parse_every_program():
    r = emogi.EmogiResult("bfs", 2, emogi.EmogiMemory.ZERO_COPY)
    emogi.parse("bfs", BFS_OUTPUT, r)
    assert r.sources == [0, 2048] and r.iterations == [11, 9] and r.ms == [2.5, 1.5]
    assert r.mean_ms == 2.0 and r.ms_per_iteration == pytest.approx(4.0 / 20)
    cc = emogi.EmogiResult("connected_components", 1, emogi.EmogiMemory.GPU)
    emogi.parse("connected_components", "total iterations: 4\ntotal components: 17\ntotal time: 12.25 ms\n", cc)
    assert (cc.ms, cc.iterations, cc.components) == ([12.25], [4], 17)
    pr = emogi.EmogiResult("pagerank", 2, emogi.EmogiMemory.ZERO_COPY)
    emogi.parse("pagerank", "Initialization done\niteration  69, time  4660.500000 ms\n", pr)
    assert pr.ms == [4660.5] and pr.ms_per_iteration == pytest.approx(4660.5 / 69)
    nothing = emogi.EmogiResult("sssp", 1, emogi.EmogiMemory.GPU)
    emogi.parse("sssp", "Segmentation fault\n", nothing)
    assert nothing.ms == [] and nothing.mean_ms is None


def test_commands_use_emogi_sources_in_one_run_and_others_one_by_one():
    run_all = emogi.commands("/e", "bfs", "/g.bel", 2, emogi.EmogiMemory.ZERO_COPY, [0, 25, 50, 75], 100, 0.85)
    assert run_all == [["/e/bfs_32", "-f", "/g.bel", "-t", "2", "-m", "2", "-i", "4"]]
    one_by_one = emogi.commands("/e", "sssp", "/g.bel", 1, emogi.EmogiMemory.GPU, [0, 26], 100, 0.85)
    assert [c[-2:] for c in one_by_one] == [["-r", "0"], ["-r", "26"]]
    assert emogi.commands("/e", "pagerank", "/g.bel", 1, emogi.EmogiMemory.GPU, [None], 100, 0.5)[0][-2:] == [
        "-a", "0.5"]


def test_sources_move_off_vertices_without_edges():
    # 0 -> 1, 5 -> 6 (both ways); vertices 2, 3, 4, 7 have no edges.
    g = CSRGraph.from_coo([0, 5], [1, 6], 8, symmetrize=True)
    assert tp.sources_for(g, 4) == [0, 5, 5, 6]
    assert tp.sources_for(g, 8) == [0, 1, 5, 5, 5, 5, 6, 0]  # 7 has no edges and none follow: wraps to 0


def run(key, ms, bytes_read=0):
    return {"key": key, "source": key, "ms": ms, "bytes_read": bytes_read, "match": True}


def row(graph, op, placement, variant, times, matched=True, runs_on=None, share=None):
    runs = [run(k, ms) for k, ms in times.items()]
    return {"graph": graph, "op": op, "placement": placement, "variant": variant, "runs_on": runs_on or variant,
            "runs": runs, "matched": matched, "mean_ms": sum(times.values()) / len(times), "link_share": share}


def test_auto_over_best_takes_common_sources_and_only_correct_variants():
    rows = [
        row("g", "bfs", "unified", "auto", {0: 10.0, 1: 10.0}, runs_on="direction"),
        row("g", "bfs", "unified", "direction", {0: 10.0, 1: 10.0}),
        row("g", "bfs", "unified", "frontier", {0: 8.0}),  # ran one source: 10 / 8 over it
        row("g", "bfs", "unified", "naive", {0: 1.0, 1: 1.0}, matched=False),  # wrong: not a candidate
        row("g", "bfs", "cuda", "auto", {0: 5.0}, runs_on="aligned"),
        row("g", "bfs", "cuda", "aligned", {0: 5.5}),
        row("g", "bfs", "managed", "auto", {0: 50.0}),  # no variants run there
    ]
    got = {(a["placement"]): a for a in tp.auto_over_best(rows)}
    assert set(got) == {"unified", "cuda"}
    assert got["unified"]["best"] == "frontier" and got["unified"]["ratio"] == pytest.approx(1.25)
    assert got["cuda"]["ratio"] == pytest.approx(5.0 / 5.5)
    graphs = [{"name": "g", "family": "kron", "rows": rows}]
    bars = tp.bars(graphs)
    assert bars["auto_over_best_max"] == pytest.approx(1.25)
    assert bars["auto_over_best_worst_case"] == "g bfs unified: auto (direction) vs frontier"


def test_repetitions_compare_by_their_medians():
    """cc and pagerank runs are repetitions (no source): the ratio is of their medians, the
    time each row reports, so one slow repetition does not decide it; sources still sum."""
    def reps(variant, times):
        r = row("g", "cc", "cuda", variant, dict(enumerate(times)))
        for x in r["runs"]:
            x["source"] = None
        return r

    auto = reps("auto", [1.5, 1.3, 1.3, 4.7, 1.3])
    staged = reps("staged", [1.2, 1.3, 1.3, 1.3, 1.4])
    assert tp.common_ratio(auto, staged) == pytest.approx(1.0)
    got = tp.auto_over_best([auto, staged])
    assert len(got) == 1 and got[0]["ratio"] == pytest.approx(1.0)
    bfs_auto = row("g", "bfs", "cuda", "auto", {0: 1.0, 1: 5.0})
    bfs_other = row("g", "bfs", "cuda", "merged", {0: 1.0, 1: 1.0})
    assert tp.common_ratio(bfs_auto, bfs_other) == pytest.approx(3.0)


def test_hopeless_variants_are_those_over_the_factor_times_the_fastest_correct_one():
    rows = [row("g", "sssp", "cuda", "auto", {0: 1.0}, runs_on="frontier"),
            row("g", "sssp", "cuda", "frontier", {0: 2.0, 1: 4.0}),  # mean 3: the fastest correct one
            row("g", "sssp", "cuda", "naive", {0: 0.5}, matched=False),  # wrong: not the fastest
            row("g", "sssp", "cuda", "merged", {0: 30.0}),  # exactly 10x: not hopeless
            row("g", "sssp", "cuda", "async", {0: 31.0, 1: 31.0})]
    assert tp.hopeless_variants(rows, 10.0) == {"async": pytest.approx(31.0 / 3.0)}
    assert tp.hopeless_variants(rows, 5.0) == {"merged": 10.0, "async": pytest.approx(31.0 / 3.0)}
    assert tp.hopeless_variants([row("g", "sssp", "cuda", "async", {0: 1.0}, matched=False)], 10.0) == {}


def fake_runs(monkeypatch):
    """Replaces the op and its check in tp.measure; returns the list of sources it is called with."""
    calls = []

    def fake_run_once(op, graph, variant, source, args):
        calls.append(source)
        return torch.zeros(1), torch.tensor([4, 1])

    monkeypatch.setattr(tp, "run_once", fake_run_once)
    monkeypatch.setattr(tp, "check", lambda *a: {"match": True})
    return calls


def test_a_run_over_the_hopeless_time_is_not_repeated(monkeypatch):
    fake_runs(monkeypatch)
    ticks = iter(range(0, 1000, 2))  # every run takes 1 s of the fake clock
    monkeypatch.setattr(tp.time, "perf_counter", lambda: next(ticks) / 2)
    args = tp.parse_args(["--quick"])
    g = CSRGraph.from_coo([0], [1], 2)
    clock = tp.Clock(1e9)
    assert len(tp.measure("bfs", g, "naive", [0, 1, 2], None, args, clock, hopeless_ms=500.0)) == 1
    assert len(tp.measure("bfs", g, "naive", [0, 1, 2], None, args, clock, hopeless_ms=2000.0)) == 3
    assert len(tp.measure("bfs", g, "naive", [0, 1, 2], None, args, clock)) == 3


def test_a_quick_configuration_is_warmed_up_and_repeats_more(monkeypatch):
    """Under --warmup-ms, untimed runs of the first source (not reported) until that much time
    has passed, however many runs that takes (at most WARMUP_MAX_RUNS), and repetition ops take
    --quick-reps runs; a slow configuration keeps every run; a cold (before_each) one is never
    warmed up."""
    calls = fake_runs(monkeypatch)
    step = {"s": 0.01}  # each run takes this long
    now = {"t": 0.0}

    def clock_tick():
        now["t"] += step["s"]  # the clock moves by a run between the two reads around it
        return now["t"]

    monkeypatch.setattr(tp.time, "perf_counter", clock_tick)
    args = tp.parse_args(["--quick", "--quick-reps", "7", "--warmup-ms", "50"])
    g = CSRGraph.from_coo([0], [1], 2)
    clock = tp.Clock(1e9)
    runs = tp.measure("pagerank", g, "naive", [None] * 3, None, args, clock)
    assert len(runs) == 7 and len(calls) == 5 + 7  # 5 runs of 10 ms warm it up
    assert [r["key"] for r in runs] == list(range(7))
    calls.clear()
    assert len(tp.measure("bfs", g, "naive", [0, 1], None, args, clock)) == 2 and calls == [0] * 5 + [0, 1]
    calls.clear()
    step["s"] = 0.001  # 1 ms runs: 50 of them warm it up, more than --quick-reps
    assert len(tp.measure("bfs", g, "naive", [0, 1], None, args, clock)) == 2 and calls == [0] * 50 + [0, 1]
    calls.clear()
    monkeypatch.setattr(tp, "WARMUP_MAX_RUNS", 9)  # the warm-up's cap, however quick the op
    assert len(tp.measure("bfs", g, "naive", [0, 1], None, args, clock)) == 2 and calls == [0] * 9 + [0, 1]
    calls.clear()
    step["s"] = 0.01
    assert len(tp.measure("bfs", g, "naive", [0, 1], None, args, clock, before_each=lambda: None)) == 2
    assert calls == [0, 1]
    step["s"] = 0.2
    calls.clear()
    assert len(tp.measure("pagerank", g, "naive", [None] * 3, None, args, clock)) == 3 and len(calls) == 3


def test_references_are_computed_before_the_configurations():
    """prepare() fills every reference check() reads for the op, so none is computed between
    timed runs."""
    spec = tp.GraphSpec("tiny", tp.Family.URAND, scale=2)
    g = CSRGraph.from_coo([0, 1, 2], [1, 2, 0], 4, symmetrize=True)
    refs = tp.References(spec, g, None, 0.85)
    refs.prepare("bfs", [0, 2])
    assert sorted(refs._bfs) == [0, 2] and refs._cc is None
    refs.prepare("sssp", [1])
    assert sorted(refs._sssp) == [1]
    refs.prepare("connected_components", [None])
    refs.prepare("pagerank", [None])
    assert refs._cc is not None and refs._pr is not None


def test_link_share_is_bytes_over_time_over_the_ceiling():
    runs = [run(0, 100.0, bytes_read=2_000_000_000), run(1, 300.0, bytes_read=6_000_000_000)]
    assert tp.link_share(runs, 25.0) == pytest.approx(8e9 / 0.4 / 25e9)
    assert tp.link_share(runs, None) is None
    rows = [row("k", "bfs", "unified", v, {0: 1.0}, share=s) for v, s in
            (("frontier", 0.4), ("aligned", 0.5), ("direction", 0.9))]
    rows += [row("k", "pagerank", "unified", "push", {0: 1.0}, share=0.9),
             row("k", "pagerank", "unified", "frontier", {0: 1.0}, share=0.7),
             row("k", "pagerank", "cuda", "merged", {0: 1.0}, share=0.95)]
    bars = tp.bars([{"name": "k", "family": "kron", "rows": rows}])
    assert (bars["topdown_bfs_link_share"], bars["topdown_bfs_link_share_variant"]) == (0.5, "aligned")
    assert (bars["power_pagerank_link_share"], bars["power_pagerank_link_share_variant"]) == (0.7, "frontier")


FAKE_PROGRAM = r"""#!/bin/bash
# Prints what EMOGI's program of this name prints; PageRank with the edge list in GPU memory
# fails as EMOGI's does.
prog=$(basename "$0"); n=1; src=0; many=0; mem=0; file=""
while getopts "f:r:t:i:m:a:l:d:o:" o; do
  case $o in f) file=$OPTARG;; r) src=$OPTARG;; i) n=$OPTARG; many=1;; m) mem=$OPTARG;; *) ;; esac
done
echo "$file"
verts=$(( $(od -An -t u8 -N8 "$file.col") - 1 ))
echo "Vertex: $verts, Edge: 1"
case $prog in
  bfs_32|sssp_32)
    for ((i = 0; i < n; i++)); do
      if [ $many = 1 ]; then s=$(( i * (verts / n) )); else s=$src; fi
      echo "run   $i: src $s, iteration   7, time 1.250000 ms"
    done;;
  cc_32) printf 'total iterations: 3\ntotal components: 1\ntotal time: 2.000000 ms\n';;
  pagerank_32) if [ "$mem" = 0 ]; then exit 139; fi; echo "iteration  20, time    40.000000 ms";;
esac
"""


def fake_emogi(root):
    os.makedirs(root)
    with open(os.path.join(root, "fake.sh"), "w") as f:
        f.write(FAKE_PROGRAM)
    with open(os.path.join(root, "Makefile"), "w") as f:
        f.write("bfs_32 sssp_32 cc_32 pagerank_32: fake.sh\n\tcp fake.sh $@ && chmod +x $@\n")
    os.chmod(os.path.join(root, "fake.sh"), stat.S_IRWXU)
    return root


def test_a_quick_run_beside_emogi_writes_bars_and_measured_peer_rows(tmp_path):
    checkout = fake_emogi(str(tmp_path / "EMOGI"))
    out = tmp_path / "out"
    assert tp.main(["--quick", "--graphs", "road,kron", "--road-side", "12", "--kron-scale", "7", "--emogi", checkout,
                    "--bel-dir", str(tmp_path / "bel"), "--out", str(out)]) == 0
    result = json.loads((out / "traversal_peer_quick.json").read_text())
    assert {"auto_over_best_max", "topdown_bfs_link_share", "power_pagerank_link_share", "emogi_measured"} <= set(
        result["bars"])
    assert result["bars"]["every_variant_matches_reference"] is True
    for g in result["graphs"]:
        # every variant of every op ran, beside auto, in the unified placement
        ran = {(r["op"], r["variant"]) for r in g["rows"] if r["runs"]}
        assert all((tp.SHORT[op], v) in ran for op in tp.OPS for v in ["auto", *tp.OP_VARIANTS[op]])
        peer = g["emogi"]
        assert peer["measured"] and peer["source"].startswith("measured in this run")
        by = {(r["op"], r["placement"], r["kernel"]): r for r in peer["results"]}
        bfs = by[("bfs", "unified", 2)]
        assert bfs["sources"] == g["sources"] and bfs["same_sources"] and bfs["ms"] == [1.25] * len(g["sources"])
        assert by[("cc", "cuda", 1)]["components_match"] == (g["components"] == 1)
        assert by[("pagerank", "unified", 1)]["ms_per_iteration"] == pytest.approx(2.0)
        assert "exit status 139" in by[("pagerank", "cuda", 1)]["error"]
        assert os.path.exists(tmp_path / "bel" / f"{g['name']}.bel.val")  # unit weights for kron's sssp
    md = (out / "traversal_peer_quick.md").read_text()
    assert "measured in this run" in md and "auto against the fastest variant" in md


def test_emogi_placements_choose_where_its_edge_list_goes(tmp_path):
    checkout = fake_emogi(str(tmp_path / "EMOGI"))
    out = tmp_path / "out"
    assert tp.main(["--quick", "--graphs", "kron", "--kron-scale", "6", "--emogi", checkout, "--emogi-placements",
                    "unified", "--out", str(out)]) == 0
    result = json.loads((out / "traversal_peer_quick.json").read_text())
    (g,) = result["graphs"]
    assert {r["placement"] for r in g["emogi"]["results"]} == {"unified"}
    with pytest.raises(SystemExit):
        tp.parse_args(["--quick", "--emogi-placements", "managed"])


def test_without_a_checkout_the_quoted_figures_are_labelled(tmp_path):
    spec = tp.GraphSpec("urand26", tp.Family.URAND, scale=26, edge_factor=8)
    section = tp.emogi_section(spec, None, [0], 1, 1, None, None)
    assert not section["measured"] and section["source"].startswith("quoted, not measured in this run")
    assert {q["op"] for q in section["quoted"]} == {"bfs", "connected_components", "pagerank"}
    other = tp.GraphSpec("urand20", tp.Family.URAND, scale=20, edge_factor=8)
    assert tp.emogi_section(other, None, [0], 1, 1, None, None)["source"] is None


def test_merge_keeps_the_other_graphs_of_the_same_device(tmp_path):
    env = {"gpu": "NVIDIA H100"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"environment": env, "graphs": [{"name": "a", "rows": []}, {"name": "b", "rows": []}]}))
    new = [{"name": "b", "rows": [1]}]
    assert [g["name"] for g in tp.merged_graphs(str(path), env, new)] == ["a", "b"]
    assert tp.merged_graphs(str(path), env, new)[1]["rows"] == [1]
    assert tp.merged_graphs(str(path), {"gpu": "NVIDIA H200"}, new) == new


def test_guard_bars_are_copied_in_from_the_same_gpu_only(tmp_path):
    out = tmp_path / "out"
    assert tp.main(["--quick", "--graphs", "kron", "--kron-scale", "6", "--out", str(out)]) == 0
    stem = str(out / "traversal_peer_quick")
    assert "guard_overhead" not in tp.refresh(stem)  # no guard_overhead.json beside it
    gpu = json.loads((out / "traversal_peer_quick.json").read_text())["environment"]["gpu"]
    guard = {"guard_overhead": 0.012, "guard_overhead_within_3pct": True}
    (out / tp.GUARD_RESULT).write_text(json.dumps({"environment": {"gpu": "another GPU"}, "bars": guard}))
    assert "guard_overhead" not in tp.refresh(stem)
    (out / tp.GUARD_RESULT).write_text(json.dumps({"environment": {"gpu": gpu}, "bars": guard}))
    bars = tp.refresh(stem)
    assert bars["guard_overhead"] == 0.012 and bars["guard_overhead_within_3pct"] is True
    assert json.loads((out / "traversal_peer_quick.json").read_text())["bars"] == bars
    assert "guard_overhead" in (out / "traversal_peer_quick.md").read_text()


def test_help_names_the_sizes_and_emogi(capsys):
    with pytest.raises(SystemExit):
        tp.main(["--help"])
    text = capsys.readouterr().out
    assert all(x in text for x in ("--kron-scale", "--road-side", "--emogi", "--graphs", "--merge"))


def test_unknown_family_is_refused():
    with pytest.raises(SystemExit):
        tp.parse_args(["--graphs", "mesh"])


def test_ratios_to_emogi_use_its_fastest_kernel_and_pagerank_per_pass():
    rows = [row("u", "bfs", "unified", "auto", {0: 60.0, 1: 40.0}),
            dict(row("u", "pagerank", "unified", "auto", {0: 800.0}), ms_per_pass=80.0, l1_vs_fp64=1e-5)]

    def peer(op, kernel, ms, iterations, error=None):
        return {"op": op, "placement": "unified", "kernel": kernel, "mean_ms": ms, "error": error,
                "ms_per_iteration": ms / iterations}

    section = {"measured": True, "results": [peer("bfs", 1, 200.0, 20), peer("bfs", 2, 100.0, 20),
                                             peer("bfs", 0, 10.0, 20, error="exit status 1"),
                                             peer("pagerank", 2, 4000.0, 100)]}
    bars = tp.bars([{"name": "u", "family": "urand", "rows": rows, "emogi": section}])
    assert bars["emogi_measured"] is True
    assert bars["bfs_unified_over_emogi"] == pytest.approx(50.0 / 100.0)  # the failed kernel does not count
    assert bars["pagerank_unified_over_emogi"] == pytest.approx(80.0 / 40.0)
    assert bars["cc_unified_over_emogi"] is None


def test_emogi_cuda13_shim_compiles_a_device_ordinal_advice(tmp_path):
    """EMOGI's sources call cudaMemAdvise with a device ordinal, an overload CUDA 13 removed;
    the header force-included when they are built restores it (compile only: no GPU here)."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    src = tmp_path / "advise.cu"
    src.write_text("int main() { int *p = nullptr; cudaMallocManaged(&p, 64);\n"
                   "  return cudaMemAdvise(p, 64, cudaMemAdviseSetAccessedBy, 0) != cudaSuccess; }\n")
    out = subprocess.run([nvcc, "-c", "-include", emogi.CUDA13_SHIM, str(src), "-o", str(tmp_path / "advise.o")],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
