"""zerocopy::block_mean (GraphSAGE's fused mean aggregation): forward and gradient against a
dense float64 reference on fresh random blocks, every dtype and device; argument errors; ids
out of range; torch.library integration."""

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy._compat import has_opcheck

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def reference(h_src: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n_dst: int) -> torch.Tensor:
    """Mean aggregation as a dense matrix product, in float64: A[d, s] counts the edges s -> d."""
    adj = torch.zeros(n_dst, h_src.shape[0], dtype=torch.float64)
    for s, d in zip(src.tolist(), dst.tolist()):
        adj[d, s] += 1
    deg = adj.sum(1, keepdim=True).clamp(min=1)
    return (adj / deg) @ h_src.double()


def random_block(gen, n_src: int, n_dst: int, edges: int, index_dtype=torch.int64):
    src = torch.randint(0, n_src, (edges,), generator=gen, dtype=torch.int64)
    dst = torch.randint(0, n_dst, (edges,), generator=gen, dtype=torch.int64) if n_dst else src[:0]
    return src.to(index_dtype), dst.to(index_dtype)


def poison_allocator(device: str) -> None:
    """Fill free cached GPU memory with NaN so an output element the op never writes shows."""
    if device == "cuda":
        junk = torch.full((1 << 24,), float("nan"), device=device)
        del junk


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(40, 13, 200, 33), (9, 5, 3, 1), (64, 20, 0, 8), (30, 30, 500, 70)],
                         ids=["typical", "isolated-dsts", "no-edges", "wide"])
def test_forward_and_gradient_match_reference(device, gen, dtype, shape):
    n_src, n_dst, edges, features = shape
    src, dst = random_block(gen, n_src, n_dst, edges)
    h64 = torch.randn(n_src, features, generator=gen, dtype=torch.float64)
    h = h64.to(dtype).to(device).requires_grad_(True)
    poison_allocator(device)
    out = zc.block_mean(h, src.to(device), dst.to(device), n_dst)
    assert out.dtype == dtype and out.shape == (n_dst, features) and out.device.type == device
    ref = reference(h64.to(dtype).double(), src, dst, n_dst)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=tol, atol=tol)

    grad_out = torch.randn(n_dst, features, generator=gen, dtype=torch.float64)
    poison_allocator(device)
    out.backward(grad_out.to(dtype).to(device))
    href = h64.to(dtype).double().requires_grad_(True)
    reference(href, src, dst, n_dst).backward(grad_out.to(dtype).double())
    assert h.grad.dtype == dtype and h.grad.shape == h.shape
    torch.testing.assert_close(h.grad.double().cpu(), href.grad, rtol=tol, atol=tol)


def test_int32_ids_and_duplicate_edges(device, gen):
    h = torch.randn(6, 4, generator=gen).to(device)
    src = torch.tensor([0, 0, 0, 5, 2], dtype=torch.int32, device=device)
    dst = torch.tensor([1, 1, 1, 1, 0], dtype=torch.int32, device=device)
    out = zc.block_mean(h, src, dst, 3)
    expect = torch.stack([h[2], (3 * h[0] + h[5]) / 4, torch.zeros(4, device=device)])
    torch.testing.assert_close(out, expect)


def test_inv_deg_output(device, gen):
    src, dst = random_block(gen, 20, 7, 50)
    h = torch.randn(20, 3, generator=gen).to(device)
    _, inv_deg = torch.ops.zerocopy.block_mean.default(h, src.to(device), dst.to(device), 7)
    deg = torch.bincount(dst, minlength=7).clamp(min=1).float()
    torch.testing.assert_close(inv_deg.cpu(), 1 / deg)
    # No features at all: inv_deg is still every destination's.
    _, inv0 = torch.ops.zerocopy.block_mean.default(h[:, :0], src.to(device), dst.to(device), 7)
    torch.testing.assert_close(inv0.cpu(), 1 / deg)


def test_non_contiguous_inputs(device, gen):
    h = torch.randn(8, 12, generator=gen).to(device)[:, ::2]
    pairs = torch.randint(0, 5, (30, 2), generator=gen).to(device)
    src, dst = pairs[:, 0], pairs[:, 1]  # strided views
    assert not src.is_contiguous()
    out = zc.block_mean(h, src, dst, 5)
    torch.testing.assert_close(out.cpu().double(), reference(h.cpu(), src.cpu(), dst.cpu(), 5), rtol=1e-5,
                               atol=1e-5)


def test_bad_arguments_are_clear_errors(device):
    h = torch.randn(4, 3, device=device)
    e = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="h_src must be a 2-D"):
        zc.block_mean(h[0], e, e, 2)
    with pytest.raises(TypeError, match="floating point"):
        zc.block_mean(h.long(), e, e, 2)
    with pytest.raises(TypeError, match="int32 or int64"):
        zc.block_mean(h, e.float(), e.float(), 2)
    with pytest.raises(TypeError, match="src's dtype"):
        zc.block_mean(h, e, e.int(), 2)
    with pytest.raises(ValueError, match="one length"):
        zc.block_mean(h, e, e[:1], 2)
    with pytest.raises(ValueError, match="n_dst must be >= 0"):
        zc.block_mean(h, e, e, -1)
    with pytest.raises(ValueError, match="1-D"):
        zc.block_mean(h, e.view(1, 2), e.view(1, 2), 2)
    with pytest.raises(TypeError, match="must be tensors"):
        zc.block_mean(h, [0, 1], e, 2)


@pytest.mark.cuda
def test_edges_on_another_device_are_refused():
    h = torch.randn(4, 3, device="cuda")
    with pytest.raises(ValueError, match="device"):
        zc.block_mean(h, torch.tensor([0]), torch.tensor([0]), 1)


def test_ids_out_of_range(device, gen):
    h = torch.randn(5, 3, generator=gen).to(device)
    src = torch.tensor([0, 1, 9, 2], device=device)
    dst = torch.tensor([0, 0, 1, 1], device=device)
    with pytest.raises(IndexError, match="5"):
        zc.block_mean(h, src, dst, 2, check_ids=True)
    with pytest.raises(IndexError):
        zc.block_mean(h, torch.tensor([0, -1], device=device), dst[:2], 2, check_ids=True)
    with pytest.raises(IndexError):
        zc.block_mean(h, src[:2], torch.tensor([0, 2], device=device), 2, check_ids=True)
    if device == "cpu":
        with pytest.raises(IndexError, match="src holds ids outside"):
            zc.block_mean(h, src, dst, 2)
    else:
        # Unchecked on the GPU: the bad edge is skipped, never read, and the rest is right.
        out = zc.block_mean(h, src, dst, 2)
        torch.cuda.synchronize()
        expect = torch.stack([(h[0] + h[1]) / 2, h[2]])  # the skipped edge does not count
        torch.testing.assert_close(out, expect)


def test_model_step_gradients_match_the_aten_formulation(device, gen):
    """GraphSAGE through the fused op trains exactly as the same layer written in ATen ops."""
    from pytorch_zerocopy.nn import SAGEConv

    class Block:
        def __init__(self, src, dst, n_src, n_dst):
            self.src, self.dst, self.n_src, self.n_dst = src, dst, n_src, n_dst

        def edges(self):
            return self.src, self.dst

        def num_dst_nodes(self):
            return self.n_dst

        def num_src_nodes(self):
            return self.n_src

    torch.manual_seed(gen.initial_seed() % (1 << 31))
    for in_dim, out_dim in ((16, 8), (8, 16)):  # narrowing projects first; widening aggregates first
        conv = SAGEConv(in_dim, out_dim).to(device).double()
        torch.nn.init.normal_(conv.bias)
        src, dst = random_block(gen, 30, 10, 120)
        block = Block(src.to(device), dst.to(device), 30, 10)
        x = torch.randn(30, in_dim, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
        conv(block, x).square().sum().backward()
        got = [x.grad.clone()] + [p.grad.clone() for p in conv.parameters()]
        x.grad = None
        conv.zero_grad()

        def aten_mean(h):
            out = h.new_zeros(10, h.shape[1]).index_add_(0, block.dst, h.index_select(0, block.src))
            deg = h.new_zeros(10).index_add_(0, block.dst, h.new_ones(block.dst.numel())).clamp_(min=1)
            return out / deg.unsqueeze(1)

        h_dst = x[:10]
        if conv.project_first:
            y = conv.fc_self(h_dst) + aten_mean(conv.fc_neigh(x)) + conv.bias
        else:
            y = conv.fc_self(h_dst) + conv.fc_neigh(aten_mean(x)) + conv.bias
        y.square().sum().backward()
        want = [x.grad] + [p.grad for p in conv.parameters()]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.skipif(not has_opcheck(), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck(device, gen):
    src, dst = random_block(gen, 25, 9, 60)
    h = torch.randn(25, 6, generator=gen).to(device).requires_grad_(True)
    torch.library.opcheck(torch.ops.zerocopy.block_mean.default, (h, src.to(device), dst.to(device), 9))
    grad = torch.randn(9, 6, generator=gen).to(device)
    inv = torch.rand(9, generator=gen).to(device)
    torch.library.opcheck(torch.ops.zerocopy.block_mean_backward.default,
                          (grad, src.to(device), dst.to(device), inv, 25))


def test_torch_compile_fullgraph(gen):
    try:
        torch.compile(lambda x: x + 1, fullgraph=True)(torch.ones(2))
    except Exception:
        pytest.skip("torch.compile does not work on this machine (no C++ compiler or backend)")
    src, dst = random_block(gen, 12, 4, 30)
    h = torch.randn(12, 5, generator=gen)

    @torch.compile(fullgraph=True)
    def f(x, s, d):
        return zc.block_mean(x, s, d, 4) * 2 + 1

    torch.testing.assert_close(f(h, src, dst).double(), reference(h, src, dst, 4) * 2 + 1, rtol=1e-5, atol=1e-5)
