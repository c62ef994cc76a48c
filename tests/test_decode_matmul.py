"""kernels/decode_matmul.py: a matmul fused with the step after it (GELU(x @ gate.T) * (x @ up.T), GELU(x @ gate.T)
* t, x @ w.T alone, or x times three stacked weights) against the torch reference,
interpreted on a CPU and compiled on CUDA (bfloat16 included), over rows, shapes and tiles; its argument checks; a
mutation the comparison catches."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minikv.kernels as k
from minikv.kernels.decode_matmul import decode_matmul, decode_matmul_reference
from minikv.kernels.errors import InvalidTypeError, InvalidValueError
from minikv.kernels.launch import MatmulConfig

ROWS = [1, 5, 16, 64]
SHAPES = [(64, 32), (256, 96), (512, 64)]             # (K, N)
TILES = [(16, 64), (32, 32), (32, 128)]             # (block_n, block_k)
MODES = ["up", "times", "one", "stack"]


def case(mode, m, k_, n, dtype, device, seed=0):
    """x, gate and the keyword of `mode` (up, times or stack: k and v of half gate's rows; none for one)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k_, generator=gen).to(dtype).to(device)
    gate, second = ((torch.randn(n, k_, generator=gen) * k_ ** -0.5).to(dtype).to(device) for _ in "gs")
    if mode == "times":
        second = torch.randn(m, n, generator=gen).to(dtype).to(device)
    if mode == "stack":
        second = tuple((torch.randn(n // 2, k_, generator=gen) * k_ ** -0.5).to(dtype).to(device) for _ in "kv")
    return x, gate, {} if mode == "one" else {mode: second}


def _products(x, w):
    """x @ w.T in float32, and how far a sum of its terms in another order can be from it (K units of float32 in
    |x| @ |w|.T)."""
    exact = F.linear(x.float(), w.float())
    return exact, x.shape[1] * torch.finfo(torch.float32).eps * F.linear(x.float().abs(), w.float().abs())


def assert_close(got, x, gate, up=None, times=None, stack=None):
    """Equal to the reference up to the float32 sums' order (the kernel adds K in tiles) and the roundings to the
    output's dtype that such a difference can flip: one of each product, carried through GELU (slope below 1.2)
    and the multiplication, and the last one."""
    want = decode_matmul_reference(x, gate, up, times, stack)
    if up is None and times is None:
        return assert_close_plain(got, want, x, gate if stack is None else torch.cat([gate, *stack]))
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = torch.finfo(x.dtype).eps
    g, sums_g = _products(x, gate)
    err_g = eps * g.abs() + sums_g
    if up is not None:
        o, sums_o = _products(x, up)
        other, err_o = o.abs(), eps * o.abs() + sums_o
    else:
        other, err_o = times.float().abs(), torch.zeros_like(g)
    act = F.gelu(g, approximate="tanh").abs()
    bound = 1.2 * err_g * (other + err_o) + act * err_o + 2 * eps * want.float().abs()
    worst = ((got.float() - want.float()).abs() / (bound + 1e-30)).max().item()
    assert worst <= 1, f"differs by {worst:.2f}x the bound"


def assert_close_plain(got, want, x, w):
    assert got.dtype == want.dtype and got.shape == want.shape
    exact, sums = _products(x, w)
    bound = torch.finfo(x.dtype).eps * exact.abs() + sums
    worst = ((got.float() - want.float()).abs() / (bound + 1e-30)).max().item()
    assert worst <= 1, f"differs by {worst:.2f}x the bound"


def _block_m(m):
    return max(16, 1 << (m - 1).bit_length())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"n{t[0]}k{t[1]}")
@pytest.mark.parametrize("k_,n", SHAPES)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("mode", MODES)
def test_kernel_matches_reference_interpreted(mode, m, k_, n, tile, dtype):
    if not k.INTERPRETED:
        pytest.skip("compiled mode: the GPU test below covers it")
    if n % tile[0] or k_ % tile[1] or mode == "stack" and n // 2 % tile[0]:
        pytest.skip("the tiles do not divide the shape")
    x, gate, kw = case(mode, m, k_, n, dtype, "cpu")
    cfg = MatmulConfig(_block_m(m), *tile)
    assert_close(decode_matmul(x, gate, **kw, config=cfg), x, gate, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k_,n", [(1536, 6144), (1536, 256), (1536, 512), (2048, 2048), (256, 1536)])
@pytest.mark.parametrize("m", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("mode", MODES)
def test_kernel_matches_reference_on_gpu(mode, m, k_, n, dtype):
    if not torch.cuda.is_available() or k.INTERPRETED:
        pytest.skip("needs CUDA")
    x, gate, kw = case(mode, m, k_, n, dtype, "cuda")
    got = decode_matmul(x, gate, **kw)
    assert got is not None, "the E2B shapes have a configuration"
    assert_close(got, x, gate, **kw)


def test_no_configuration_for_a_prefill_or_float32_on_gpu():
    from minikv.kernels.launch import matmul_config
    if k.INTERPRETED:
        assert matmul_config(5, 96, 64, torch.float32) is not None
        assert matmul_config(5, 100, 64, torch.float32) is None        # 100 columns: no tile divides them
    else:
        assert matmul_config(65, 6144, 1536, torch.bfloat16) is None
        assert matmul_config(64, 6144, 1536, torch.float32) is None
        assert matmul_config(64, 6144, 1536, torch.bfloat16) is not None


def test_a_wrong_tile_order_is_caught():
    """The comparison has teeth: the reference with its K halves' roles swapped between gate and up is far off."""
    x, gate, kw = case("up", 5, 128, 32, torch.float32, "cpu")
    up = kw["up"]
    mixed = torch.cat([gate[:, :64], up[:, 64:]], dim=1)
    with pytest.raises(AssertionError, match="differs by"):
        assert_close(decode_matmul_reference(x, mixed, up=up), x, gate, up=up)


def test_rejects_bad_input():
    x, gate, kw = case("up", 4, 64, 32, torch.float32, "cpu")
    up = kw["up"]
    with pytest.raises(InvalidTypeError, match="x must be a 2-D"):
        decode_matmul(x[None], gate, up)
    with pytest.raises(InvalidValueError, match="at most one of"):
        decode_matmul(x, gate, up, stack=(up, up))
    with pytest.raises(InvalidValueError, match=r"gate must be contiguous torch.float32 \[N, 64\]"):
        decode_matmul(x, gate[:, :32], up)
    with pytest.raises(InvalidValueError, match="up must be"):
        decode_matmul(x, gate, up[:16])
    with pytest.raises(InvalidValueError, match="stack must be a tuple"):
        decode_matmul(x, gate, stack=up)
    with pytest.raises(InvalidValueError, match="stack must be contiguous"):
        decode_matmul(x, gate, stack=(up, up.half()))
    with pytest.raises(InvalidValueError, match=r"times must be torch.float32 \[4, 32\]"):
        decode_matmul(x, gate, times=torch.zeros(4, 31))


def small_e2b(device, dtype, hidden=64):
    from minikv.bench.sdpa_step import e2b_like_model
    return e2b_like_model(device, dtype, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=10,
                          num_attention_heads=2, head_dim=64, sliding_window=8, num_kv_shared_layers=5,
                          hidden_size_per_layer_input=16, vocab_size=40, vocab_size_per_layer_input=40)


@pytest.mark.gpu
def test_model_with_fused_matmuls_on_gpu(monkeypatch):
    """The same on CUDA in bfloat16, compiled: a decode step's logits with the fused matmuls against torch's steps."""
    if not torch.cuda.is_available() or k.INTERPRETED:
        pytest.skip("needs CUDA")
    import minikv.models.gemma4 as g
    model = small_e2b("cuda", torch.bfloat16, hidden=256)
    calls = []
    real = g.decode_matmul
    monkeypatch.setattr(g, "decode_matmul", lambda *a, **kw: calls.append(sorted(kw)) or real(*a, **kw))
    ids = torch.randint(40, (8, 1), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        got = model.logits(ids)
        monkeypatch.setattr(g, "kernels_run", lambda x: False)
        want = model.logits(ids)
    assert {tuple(c) for c in calls} >= {("stack", "validate"), ("up", "validate"), ("times", "validate"),
                                         ("validate",)}
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.05)


def test_model_with_fused_matmuls_matches_torch_steps(monkeypatch):
    """Gemma-4's decode-sized forward with the fused matmuls (and norms) run interpreted, against torch's steps: the
    stacked q/k/v, GELU(gate) * up and the per-layer input's GELU(gate) * input are wired to the right weights. A decode
    step's rows take decode_matmul; a prompt of more rows than a decode batch takes torch's steps in both runs."""
    import minikv.models.gemma4 as g
    model = small_e2b("cpu", torch.float32)
    calls = []
    real = g.decode_matmul
    monkeypatch.setattr(g, "decode_matmul", lambda *a, **kw: calls.append(sorted(kw)) or real(*a, **kw))
    ids = torch.randint(40, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model.greedy(ids, max_new_tokens=3), model.logits(ids[:, :1])
        monkeypatch.setattr(g, "kernels_run", lambda x: True)
        got = model.greedy(ids, max_new_tokens=3), model.logits(ids[:, :1])
    assert calls, "the fused matmuls ran"
    assert {tuple(c) for c in calls} >= {("stack", "validate"), ("up", "validate"), ("times", "validate"),
                                         ("validate",)}
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
