"""The pipeline's minibatches: seeds, sampling with the library's op (CPU here; the GPU sampler
beside it where a GPU exists), packing, and the GraphSAGE model over the blocks."""

from dataclasses import replace

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy import sampling
from pytorch_zerocopy.datasets import community_graph, papers_like
from pytorch_zerocopy.nn import GraphSAGE
from pytorch_zerocopy.pipeline import Mode, Phase, Plan, SampleOn
from pytorch_zerocopy.pipeline.messages import EpochMark, Minibatch
from pytorch_zerocopy.pipeline.minibatches import (GpuSampler, SeedBatch, _sample_async, epoch_batches,
                                                   minibatch_seed, sample_on_cpu, schedule)


@pytest.fixture(scope="module")
def graph():
    return community_graph(num_nodes=3000, feature_dim=8, seed=5)


@pytest.fixture(scope="module")
def directed():
    return papers_like(4000, avg_degree=6, feature_dim=8, num_classes=10, seed=3, device="cpu")


def _in_neighbours(ds, v):
    g = ds.graph
    return g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()


def _batch(ds, plan, index=0, epoch=0, phase=Phase.TRAIN):
    seeds = ds.train_idx[index * plan.batch_size:(index + 1) * plan.batch_size]
    return SeedBatch(phase, epoch, index, seeds)


def test_blocks_sample_in_neighbours_dgl_style(directed):
    """On a directed graph the rows sampled are in-neighbour lists; blocks chain, destination
    nodes come first, and each destination gets min(fanout, in-degree) distinct in-neighbours."""
    plan = Plan(fanouts=(4, 3), batch_size=32)
    b = _batch(directed, plan)
    mb = sample_on_cpu(directed.graph, directed.labels, plan, b)
    blocks = mb.blocks
    assert len(blocks) == 2 and mb.layout.input_rows == blocks[0].num_src_nodes()
    assert torch.equal(mb.labels, directed.labels[b.seeds])
    # Seeds come first among the input nodes (DGL's convention), so their labels line up.
    assert b.seeds.numel() == 32 and torch.equal(mb.input_nodes[:32], b.seeds)
    for inner, outer in zip(blocks, blocks[1:]):
        assert inner.num_dst_nodes() == outer.num_src_nodes()
    nodes = mb.input_nodes
    for block, fanout in zip(blocks, (4, 3)):
        s, d = block.edges()
        assert int(s.max()) < block.num_src_nodes() and int(d.max()) < block.num_dst_nodes()
        for j in range(0, block.num_dst_nodes(), 5):
            v = int(nodes[j])
            got = nodes[s[d == j]].tolist()
            nbrs = _in_neighbours(directed, v)
            assert len(got) == len(set(got)) == min(len(nbrs), fanout)
            assert set(got) <= set(nbrs)
        nodes = nodes[: block.num_dst_nodes()]


def test_sampling_is_reproducible_per_minibatch(graph):
    """The same (seed, epoch, phase, index) gives the same minibatch in any process or worker
    split; another index, epoch or phase gives another."""
    plan = Plan(fanouts=(5, 5), batch_size=100)
    a = sample_on_cpu(graph.graph, graph.labels, plan, _batch(graph, plan, 1))
    b = sample_on_cpu(graph.graph, graph.labels, plan, _batch(graph, plan, 1))
    assert torch.equal(a.packed, b.packed)
    c = sample_on_cpu(graph.graph, graph.labels, plan, SeedBatch(Phase.TRAIN, 1, 1, _batch(graph, plan, 1).seeds))
    assert not torch.equal(a.packed, c.packed)
    seeds = {minibatch_seed(0, e, p, i) for e in range(3) for p in Phase for i in range(50)}
    assert len(seeds) == 3 * len(Phase) * 50
    # Two workers take alternate minibatches of the same schedule.
    full = [x for x in schedule(Plan(batch_size=500, epochs=1), graph) if isinstance(x, SeedBatch)]
    split = [x for w in (0, 1) for x in schedule(Plan(batch_size=500, epochs=1), graph, w, 2)
             if isinstance(x, SeedBatch)]
    assert sorted((x.phase.value, x.index) for x in split) == sorted((x.phase.value, x.index) for x in full)


def test_schedule_marks_every_phase(graph):
    items = list(schedule(Plan(batch_size=250, epochs=2, max_batches=2), graph))
    marks = [x for x in items if isinstance(x, EpochMark)]
    assert marks == [EpochMark(0, Phase.TRAIN), EpochMark(0, Phase.VAL), EpochMark(1, Phase.TRAIN),
                     EpochMark(1, Phase.VAL), EpochMark(1, Phase.TEST)]
    assert sum(isinstance(x, SeedBatch) and x.phase is Phase.TRAIN for x in items) == 4
    # The test split, after the last epoch only, in order.
    test = [x.seeds for x in items if isinstance(x, SeedBatch) and x.phase is Phase.TEST]
    assert torch.equal(torch.cat(test), graph.test_idx) and all(x.epoch == 1 for x in items
                                                                if isinstance(x, SeedBatch) and x.phase is Phase.TEST)
    assert len(list(schedule(Plan(batch_size=250, epochs=1, val_batches=1), graph))) == (
        len(epoch_batches(Plan(batch_size=250), graph, 0, Phase.TRAIN)) + 2 + 3)


def test_minibatch_packs_and_describes(graph):
    plan = Plan(fanouts=(3, 3), batch_size=50)
    mb = sample_on_cpu(graph.graph, graph.labels, plan, _batch(graph, plan))
    assert mb.packed.dtype == torch.int64 and mb.packed.numel() == mb.layout.numel
    description = mb.with_packed(None)
    assert description.packed is None and description.layout == mb.layout
    again = description.with_packed(mb.packed.clone())
    for x, y in zip(again.blocks, mb.blocks):
        assert torch.equal(x.src, y.src) and torch.equal(x.dst, y.dst) and x.num_src == y.num_src
    replayed = mb.relabelled(epoch=3, step=9)
    assert (replayed.epoch, replayed.step, replayed.sample_ms) == (3, 9, 0.0) and replayed.packed is mb.packed
    with pytest.raises(ValueError, match="source nodes' ids"):
        Minibatch.pack(Phase.TRAIN, 0, 0, [sampling.Block(mb.blocks[0].src, mb.blocks[0].dst, 5, 3)], mb.labels)


@pytest.mark.parametrize("eids", [False, True])
def test_minibatch_parts_are_its_views_in_one_split(eids):
    """``Minibatch.parts`` cuts the packed tensor as the properties do: the same values, views
    of it (writing one writes the packed tensor), the labels in the pieces asked for."""
    gen = torch.Generator().manual_seed(5)
    nodes = torch.randperm(40, generator=gen)[:12]
    blocks = [sampling.Block(torch.randint(0, 12, (e,), generator=gen), torch.randint(0, d, (e,), generator=gen),
                             12 if h == 0 else s, d, nodes=nodes if h == 0 else None,
                             eids=torch.randint(0, 99, (e,), generator=gen))
              for h, (e, s, d) in enumerate([(17, 12, 7), (9, 7, 3)])]
    labels = torch.randint(-9, 9, (10,), generator=gen)
    mb = Minibatch.pack(Phase.TRAIN, 0, 0, blocks, labels, eids=eids)
    parts = mb.parts([3, 0, 7])
    assert torch.equal(parts.nodes, mb.input_nodes) and [p.numel() for p in parts.labels] == [3, 0, 7]
    assert torch.equal(torch.cat(parts.labels), mb.labels) and parts.edges.shape == (2, 26)
    assert torch.equal(parts.edges[0], mb.src) and torch.equal(parts.edges[1], mb.dst)
    assert (parts.eids is None) if not eids else torch.equal(parts.eids, mb.eids)
    assert torch.equal(mb.parts().labels[0], labels) and len(mb.parts().labels) == 1
    assert [p.numel() for p in mb.parts([-1, 4]).labels] == [6, 4]  # a first piece of -1: the rest
    parts.edges[1, 0] = -5  # a view
    assert int(mb.dst[0]) == -5
    for wrong in ([3, 3], [-1, 11], [4, -1, 7]):
        with pytest.raises(ValueError, match="add up"):
            mb.parts(wrong)


def test_async_sample_on_the_cpu_is_the_cpu_sample(graph):
    """On the CPU the sampler's asynchronous call gives the same minibatch as the CPU sampler."""
    plan = Plan(fanouts=(3, 3), batch_size=40)
    b = _batch(graph, plan)
    blocks = _sample_async(graph.graph, b.seeds, plan, b).result()
    want = sample_on_cpu(graph.graph, graph.labels, plan, b)
    assert torch.equal(Minibatch.pack(b.phase, 0, 0, blocks, graph.labels[b.seeds]).packed, want.packed)


def test_graphsage_forward_shapes_and_layer_check(graph):
    plan = Plan(fanouts=(3, 3), batch_size=16)
    mb = sample_on_cpu(graph.graph, graph.labels, plan, _batch(graph, plan))
    model = GraphSAGE(graph.feature_dim, 16, graph.num_classes, num_layers=2)
    logits = model(mb.blocks, graph.features[mb.input_nodes])
    assert logits.shape == (16, graph.num_classes) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="layers"):
        model(mb.blocks[:1], graph.features[mb.input_nodes])


@pytest.mark.cuda
def test_gpu_sampler_samples_on_the_gpu_as_the_cpu_does(directed):
    """The producer's GPU sampler reads the in-neighbour lists in unified (host) memory, samples
    on the GPU, and gives every minibatch of the run exactly as the CPU sampler does for the
    same (seed, epoch, phase, index), with the next samples in flight while one is handed out."""
    plan = Plan(mode=Mode.ZEROCOPY, device="cuda:0", sample_on=SampleOn.GPU, num_samplers=0, fanouts=(5, 4),
                batch_size=16, epochs=2, max_batches=3, val_batches=2, seed=7)
    device = torch.device("cuda", 0)
    sampler = GpuSampler(plan, directed, device, ahead=2)
    assert sampler.graph.placement == "unified" and sampler.graph.indptr.is_cuda
    assert zc.is_unified(sampler.graph.indices)
    expected = [x if isinstance(x, EpochMark) else (x.phase, x.epoch, x.index) for x in schedule(plan, directed)]
    # Two epochs of 3 training minibatches (of 48 training nodes) and 1 validation minibatch
    # (of 4 nodes), then 1 test minibatch (of 8).
    assert sum(not isinstance(x, EpochMark) for x in expected) == 2 * (3 + 1) + 1
    got = []
    for item in sampler:
        if isinstance(item, EpochMark):
            got.append(item)
            continue
        mb = item.batch
        got.append((mb.phase, mb.epoch, mb.step))
        assert mb.packed.is_cuda and item.ready is not None
        item.ready.synchronize()
        batch = SeedBatch(mb.phase, mb.epoch, mb.step, epoch_batches(plan, directed, mb.epoch, mb.phase)[mb.step])
        want = sample_on_cpu(directed.graph, directed.labels, plan, batch)
        assert mb.layout == want.layout and torch.equal(mb.packed.cpu(), want.packed), (mb.phase, mb.epoch, mb.step)
    assert got == expected  # every minibatch of the schedule once, in order, marks after their phase


class _FakeEvent:
    def __init__(self, *args, **kwargs):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        pass


class _FakeStream:
    def __init__(self, *args, **kwargs):
        pass


def test_gpu_sampler_keeps_samples_in_flight_in_schedule_order(directed, monkeypatch):
    """The GPU sampler's bookkeeping, run on the CPU with stand-in streams and events: every
    minibatch of the schedule once, in order, marks after their phase, ``ahead`` samples
    issued before one is handed out, and the replay diagnostic sending kept samples again."""
    import contextlib

    from pytorch_zerocopy.graph import CSRGraph
    from pytorch_zerocopy.pipeline import minibatches

    # The sampler's graph stays in host memory, so that the CPU op samples it on any machine:
    # where a GPU serves unified tensors, a unified graph is sampled on the GPU (the test above).
    host_to = CSRGraph.to
    monkeypatch.setattr(CSRGraph, "to", lambda self, placement, device=None: host_to(self, "cpu"))
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    issued, finished = [], []
    real_start, real_finish = minibatches.GpuSampler._start, minibatches.GpuSampler._finish

    def start(self, batch):
        issued.append((batch.phase, batch.epoch, batch.index))
        return real_start(self, batch)

    def finish(self, batch, started):
        finished.append((batch.phase, batch.epoch, batch.index))
        return real_finish(self, batch, started)

    monkeypatch.setattr(minibatches.GpuSampler, "_start", start)
    monkeypatch.setattr(minibatches.GpuSampler, "_finish", finish)
    plan = Plan(fanouts=(3, 3), batch_size=8, epochs=2, max_batches=4, val_batches=2)
    expected = [x if isinstance(x, EpochMark) else (x.phase, x.epoch, x.index) for x in schedule(plan, directed)]
    total = sum(not isinstance(x, EpochMark) for x in expected)
    assert total == 2 * (4 + 1) + 1  # the validation and test splits hold one minibatch each
    items = []
    for item in GpuSampler(plan, directed, torch.device("cpu"), ahead=3):
        if not isinstance(item, EpochMark):
            key = (item.batch.phase, item.batch.epoch, item.batch.step)
            assert len(issued) - len(finished) == min(3, total - len(finished))  # samples in flight
            want = sample_on_cpu(directed.graph, directed.labels, plan, SeedBatch(
                key[0], key[1], key[2], epoch_batches(plan, directed, key[1], key[0])[key[2]]))
            assert torch.equal(item.batch.packed, want.packed) and item.ready.recorded
        items.append(item)
    assert [x if isinstance(x, EpochMark) else (x.batch.phase, x.batch.epoch, x.batch.step) for x in items] == expected
    assert issued == finished == [x for x in expected if not isinstance(x, EpochMark)]
    # Replay: the first 2 samples of each phase are kept and sent again in turn.
    issued.clear()
    finished.clear()
    replayed = [x for x in GpuSampler(replace(plan, replay=2), directed, torch.device("cpu"), ahead=1)
                if not isinstance(x, EpochMark)]
    assert len(issued) == 2 + 2 + 1 and len(replayed) == total  # 2 training samples kept; 1 per validation; test
    train = [x for x in replayed if x.batch.phase is Phase.TRAIN]
    assert [x.batch.step for x in train] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert train[2].batch.packed is train[0].batch.packed and train[2].batch.sample_ms == 0


def test_gpu_sampler_of_a_loader_takes_no_seeds_past_a_mark(directed, monkeypatch):
    """A loader's seeds arrive as its minibatches are delivered: the GPU sampler hands out an
    epoch's mark (after every minibatch before it) before it asks for more seeds, which would
    otherwise wait for ever for an epoch that has not begun."""
    import contextlib
    import queue

    from pytorch_zerocopy.graph import CSRGraph
    from pytorch_zerocopy.pipeline.loader import EpochBatches, FedStage, SeedRange, _SeedBuffer
    host_to = CSRGraph.to
    monkeypatch.setattr(CSRGraph, "to", lambda self, placement, device=None: host_to(self, "cpu"))
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    class NeverWaits(queue.Queue):
        def get(self, block=True, timeout=None):
            assert not self.empty(), "the sampler asked for seeds that are sent only after the mark is delivered"
            return super().get(block, timeout)

    seeds = NeverWaits()
    stage = FedStage()
    stage.queues = [seeds]
    plan = Plan(fanouts=(3, 3), batch_size=8)
    buffer = _SeedBuffer()

    def send(epoch, batches, carried=None):  # as the loader's process sends an epoch
        sent = EpochBatches.of([(b, carried) for b in batches], torch.arange(len(batches)))
        seeds.put(buffer.write(epoch, sent, [seeds]))
        seeds.put(SeedRange(epoch, 0, len(batches)))

    send(0, list(directed.train_idx[:24].split(8)))
    seeds.put(EpochMark(0, Phase.TRAIN))
    items = iter(GpuSampler(plan, directed, torch.device("cpu"), ahead=3, stage=stage))
    first = [next(items) for _ in range(4)]
    assert [x.batch.step for x in first[:3]] == [0, 1, 2] and first[3] == EpochMark(0, Phase.TRAIN)
    assert all(x.batch.labels.numel() == 0 for x in first[:3])  # nothing carried: no labels part
    carried = torch.randint(0, 1 << 40, (8,))
    send(1, [directed.train_idx[:8]], carried)  # packed as the labels part, whatever the dataset's labels
    seeds.put(None)
    last = list(items)
    assert [x.batch.epoch for x in last] == [1]
    assert torch.equal(last[0].batch.labels, carried) and torch.equal(last[0].batch.input_nodes[:8],
                                                                       directed.train_idx[:8])


def test_loader_seed_buffer_is_reused_and_grows():
    """The process way's seeds: an epoch written once into the shared buffer, which a role reads
    back batch by batch (seeds, carried values, sample seeds); a later epoch that fits reuses
    it, a larger one makes a new, larger buffer, announced to every role first."""
    from pytorch_zerocopy.pipeline.loader import (EpochBatches, EpochSeeds, SeedBuffer, SeedRange, _RoleSeeds,
                                                  _SeedBuffer)

    class Q(list):
        put = list.append

    queues = [Q(), Q()]
    buffer = _SeedBuffer()
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 99, (n,), generator=gen), torch.randint(0, 1 << 40, (n,), generator=gen))
               for n in (4, 4, 1)]
    where = buffer.write(0, EpochBatches.of(batches, torch.tensor([7, 8, 9])), queues)
    first = buffer.values
    assert [type(m) for m in queues[0]] == [SeedBuffer] and queues[1][0].values is first and first.is_shared()
    assert where == EpochSeeds(0, 9, 3, True)
    role = _RoleSeeds()
    role.values = first
    role.start(where)
    got = list(role.batches(SeedRange(0, 0, 3)))
    assert [b.index for b in got] == [0, 1, 2] and [b.sample_seed for b in got] == [7, 8, 9]
    for b, (s, c) in zip(got, batches):
        assert torch.equal(b.seeds, s) and torch.equal(b.carried, c)
    assert [b.index for b in role.batches(SeedRange(0, 1, 3, 2))] == [1]
    with pytest.raises(RuntimeError, match="epoch 1 before"):
        next(role.batches(SeedRange(1, 0, 1)))
    small = buffer.write(1, EpochBatches.of([(torch.tensor([5]), None)], torch.tensor([1])), queues)
    assert buffer.values is first and len(queues[0]) == 1 and small == EpochSeeds(1, 1, 1, False)
    role.start(small)
    (only,) = role.batches(SeedRange(1, 0, 1))
    assert only.seeds.tolist() == [5] and only.carried is None and only.sample_seed == 1
    big = EpochBatches.of([(torch.arange(40), None)], torch.tensor([2]))
    buffer.write(2, big, queues)
    assert buffer.values is not first and buffer.values.numel() >= 43
    assert [type(m) for m in queues[1]] == [SeedBuffer] * 2


def test_epoch_batches_refuse_what_is_not_an_epoch():
    from pytorch_zerocopy.pipeline.loader import EpochBatches

    seeds = torch.arange(5)
    with pytest.raises(TypeError, match="EpochBatches.seeds must be a 1-D CPU int64 tensor, got torch.int32"):
        EpochBatches(seeds.int(), torch.tensor([0, 5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="1 sample seeds need 2 cuts"):
        EpochBatches(seeds, torch.tensor([0, 2, 5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="cuts must rise from 0 to len"):
        EpochBatches(seeds, torch.tensor([0, 4, 3]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="one value per seed"):
        EpochBatches(seeds, torch.tensor([0, 5]), torch.tensor([1]), carried=torch.arange(4))
    with pytest.raises(TypeError, match="sample_seeds must be"):
        EpochBatches(seeds, torch.tensor([0, 5]), [1])
    assert EpochBatches.of([], torch.empty(0, dtype=torch.int64)).num_batches == 0


def test_a_loader_epoch_tops_up_a_group_at_a_time():
    """Minibatches are sent once a group's worth may go, a top-up in one range per role (round
    robin by step); the marks follow the last."""
    from pytorch_zerocopy.pipeline.loader import EpochBatches, SeedRange, _Epoch

    class Q(list):
        put = list.append

    queues = [Q(), Q()]
    batches = EpochBatches.of([(torch.arange(3), None)] * 8, torch.arange(8))
    run = _Epoch(queues, 0, batches, 5, 3)
    run.top_up()  # five in flight
    assert queues[0] == [SeedRange(0, 0, 5, 2)] and queues[1] == [SeedRange(0, 1, 5, 2)]
    for _ in range(2):
        run.delivered()
        run.top_up()  # fewer than three may go: nothing sent
    assert len(queues[0]) == len(queues[1]) == 1
    run.delivered()
    run.top_up()  # three may go: the last three, then the marks
    assert queues[0][1] == SeedRange(0, 6, 8, 2) and queues[1][1] == SeedRange(0, 5, 8, 2)
    assert type(queues[0][-1]).__name__ == type(queues[1][-1]).__name__ == "EpochMark" and run.ended
    assert [list(range(r.start, r.stop, r.step)) for q in queues for r in q[:-1]] == [[0, 2, 4], [6], [1, 3], [5, 7]]
    empty = _Epoch([Q()], 1, EpochBatches.of([], torch.empty(0, dtype=torch.int64)), 5, 3)
    empty.top_up()
    assert empty.ended and [type(m).__name__ for m in empty.queues[0]] == ["EpochMark"]
