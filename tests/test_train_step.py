"""The consumer's training step: padded minibatches give the unpadded loss and gradients, the
graphed step trains like the eager one (CPU: the same padded step without capture; GPU: CUDA
graphs), minibatches past the capacities fall back, bad input is refused."""

import pytest
import torch
from torch.nn import functional as F

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.nn import GraphSAGE
from pytorch_zerocopy.sampling import sample_layers
from pytorch_zerocopy.pipeline.train_step import (IGNORE_LABEL, Capacity, EagerTrainStep, GraphedTrainStep,
                                                  PaddedBatch, batch_sizes)


@pytest.fixture(scope="module")
def graph():
    return community_graph(num_nodes=4000, feature_dim=24, seed=5)


def minibatch(graph, gen, seeds: int, fanouts=(6, 4), device="cpu", dtype=torch.float32):
    """A freshly sampled minibatch of ``seeds`` random training nodes, on ``device``."""
    ids = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=gen)[:seeds]]
    blocks = sample_layers(graph.graph, ids, list(fanouts), edge_dir="out",
                           seed=int(torch.randint(0, 2**62, (), generator=gen)))
    feats = torch.randn(blocks[0].num_src, graph.feature_dim, generator=gen, dtype=dtype)  # never the same twice
    return [b.to(device) for b in blocks], feats.to(device), graph.labels[ids].to(device)


def model_for(graph, device, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return GraphSAGE(graph.feature_dim, 16, graph.num_classes, 2, dropout=0.0).to(device=device, dtype=dtype)


def test_capacity_covers_with_headroom_and_reserves_a_row():
    sizes = [((900, 300, 64), (1700, 250)), ((1000, 280, 64), (1800, 260))]
    cap = Capacity.covering(sizes, 1.25)
    assert cap.nodes[0] >= 1251 and cap.nodes[1] >= 376 and cap.nodes[2] >= 81
    assert all(n % 64 == 0 for n in cap.nodes + cap.edges)
    assert list(cap.nodes) == sorted(cap.nodes, reverse=True)
    assert cap.edges[0] >= 2250 and cap.edges[1] >= 325
    assert all(cap.fits(s) for s in sizes)
    # Strictly fewer rows than the capacity (one is kept for padded edges); edges may fill it.
    assert not cap.fits(((cap.nodes[0], 10, 10), (10, 10)))
    assert not cap.fits(((10, 10, cap.nodes[2]), (10, 10)))
    assert cap.fits(((10, 10, 10), cap.edges))
    assert not cap.fits(((10, 10, 10), (cap.edges[0] + 1, 10)))
    assert not cap.fits(((10, 10), (10,)))  # another layer count
    # Rows never grow inward, even when a deeper layer saw more.
    assert Capacity.covering([((10, 500), (20,))], 1.0).nodes[0] >= 501
    with pytest.raises(ValueError, match="headroom"):
        Capacity.covering(sizes, 0.5)


def test_batch_sizes_refuses_blocks_that_do_not_chain(graph, gen):
    blocks, _, labels = minibatch(graph, gen, 32)
    assert batch_sizes(blocks, labels) == ((blocks[0].num_src, blocks[1].num_src, 32),
                                           (blocks[0].num_edges(), blocks[1].num_edges()))
    with pytest.raises(ValueError, match="labels"):
        batch_sizes(blocks, labels[:-1])
    blocks[1].num_src += 1
    with pytest.raises(ValueError, match="block 0 has .* but block 1"):
        batch_sizes(blocks, labels)


def test_padded_minibatch_gives_the_unpadded_loss_and_gradients(graph, gen):
    model = model_for(graph, "cpu", torch.float64)
    big = minibatch(graph, gen, 200, dtype=torch.float64)
    small = minibatch(graph, gen, 120, dtype=torch.float64)
    cap = Capacity.covering([batch_sizes(big[0], big[2])], 1.1)
    padded = PaddedBatch(cap, graph.feature_dim, torch.device("cpu"), torch.float64)
    padded.load(*big)
    padded.load(*small)  # over stale rows, edges and labels of the larger minibatch
    assert (padded.labels[120:] == IGNORE_LABEL).all()

    def loss_and_grads(blocks, feats, labels):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(blocks, feats), labels, ignore_index=IGNORE_LABEL)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    want_loss, want_grads = loss_and_grads(*small)
    got_loss, got_grads = loss_and_grads(padded.blocks, padded.feats, padded.labels)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
    # The real output rows are the unpadded ones.
    with torch.no_grad():
        torch.testing.assert_close(model(padded.blocks, padded.feats)[:120], model(small[0], small[1]))


def _train_both(graph, gen, device, dtype, capture, steps=7, oversize_at=5):
    eager_model, graphed_model = model_for(graph, device, dtype), model_for(graph, device, dtype)
    eager = EagerTrainStep(eager_model, 1e-2, torch.device(device))
    # Headroom 1.5 over 100-seed minibatches: they all fit; the 400-seed one never does.
    graphed = GraphedTrainStep(graphed_model, 1e-2, torch.device(device), warmup=2, headroom=1.5,
                               capture=capture)
    losses = []
    for i in range(steps):
        batch = minibatch(graph, gen, 400 if i == oversize_at else 100, device=device, dtype=dtype)
        want = eager(*batch)
        got = graphed(*batch)
        losses.append((float(got), float(want)))
    return eager_model, graphed_model, graphed, losses


def _assert_trained_alike(eager_model, graphed_model, losses):
    for got, want in losses:
        assert got == pytest.approx(want, rel=1e-9)
    for a, b in zip(graphed_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_padded_step_trains_like_the_eager_step_on_the_cpu(graph, gen):
    eager_model, graphed_model, graphed, losses = _train_both(graph, gen, "cpu", torch.float64, capture=False)
    _assert_trained_alike(eager_model, graphed_model, losses)
    summary = graphed.summary()
    assert summary["kind"] == "padded" and summary["steps"] == 7 and summary["fallbacks"] == 1
    assert summary["capacity"]["nodes"][-1] >= 101
    # Gradients stayed views into the one flat buffer the all-reduce averages.
    lo, hi = graphed.flat_grad.data_ptr(), graphed.flat_grad.data_ptr() + graphed.flat_grad.nbytes
    assert all(lo <= p.grad.data_ptr() < hi for p in graphed_model.parameters())


def test_graphed_step_refuses_bad_settings(graph):
    model = model_for(graph, "cpu")
    with pytest.raises(ValueError, match="warmup"):
        GraphedTrainStep(model, 1e-2, torch.device("cpu"), warmup=0, capture=False)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        GraphedTrainStep(model, 1e-2, torch.device("cpu"))
    model.layers[0].fc_self.double()
    with pytest.raises(ValueError, match="one dtype"):
        GraphedTrainStep(model, 1e-2, torch.device("cpu"), capture=False)


@pytest.mark.cuda
def test_graphed_step_trains_like_the_eager_step_on_the_gpu(graph, gen):
    eager_model, graphed_model, graphed, losses = _train_both(graph, gen, "cuda", torch.float64, capture=True)
    _assert_trained_alike(eager_model, graphed_model, losses)
    summary = graphed.summary()
    assert summary["kind"] == "cuda-graph" and summary["fallbacks"] == 1 and graphed.graphs is not None
    graphed.close()
    assert graphed.graphs is None and graphed.summary()["capture_seconds"] > 0


@pytest.mark.cuda
def test_graph_replay_never_synchronises(graph, gen):
    model = model_for(graph, "cuda")
    model.dropout.p = 0.3  # dropout's random numbers come from the graph-safe generator
    step = GraphedTrainStep(model, 1e-2, torch.device("cuda"), warmup=1, headroom=1.5)
    batches = [minibatch(graph, gen, 100, device="cuda") for _ in range(5)]
    step(*batches[0])
    step(*batches[1])  # captures, then replays
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        total = sum(step(*b) for b in batches[2:])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(total).item() and step.summary()["fallbacks"] == 0
