"""kernels/rms_norm.py: the fused RMSNorm (with RoPE, a residual, or a layer's q, k and v at once) against its torch
reference, interpreted on a CPU and compiled on CUDA (bfloat16 included); its argument checks; the model's norms on
CUDA against the torch ones."""
from __future__ import annotations

import pytest
import torch

from minikv.kernels.errors import InvalidTypeError, InvalidValueError
from minikv.kernels.rms_norm import rms_norm, rms_norm_reference

FEATURES = ["plain", "no weight", "rope", "residual", "scaled residual"]
SHAPES = [((1,), 16), ((7,), 96), ((2, 3), 256), ((3,), 1536), ((2, 5, 4), 64), ((9, 1), 512)]


def case(feature, lead, d, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, d, generator=gen) * 3).to(dtype).to(device)
    weight = None if feature == "no weight" else (torch.randn(d, generator=gen) * 0.1 + 1).to(dtype).to(device)
    kw = {}
    if feature == "rope":
        angles = torch.rand(*lead[:-1], d, generator=gen) * 6.28
        kw = dict(cos=angles.cos().to(dtype).to(device), sin=angles.sin().to(dtype).to(device))
    if feature in ("residual", "scaled residual"):
        kw = dict(residual=torch.randn(*lead, d, generator=gen).to(dtype).to(device))
    if feature == "scaled residual":           # Gemma-4's layer scalar, applied to the layer's output
        kw["scale"] = torch.tensor([0.3712], dtype=dtype, device=device)
    return x, weight, kw


def assert_within_rounding(got, want, normed):
    """Equal up to one rounding of the norm: the kernel adds the mean's squares in another order (and a GPU's
    reciprocal square root is not torch's), which can move a normed value (`normed`, the reference's plain norm) by
    a unit in its last place; RoPE and the residual carry that unit into their products and sums, whose own
    roundings then add one unit of the result. So: two units of the result plus two of the row's largest normed
    value (a sum of two terms can cancel to far less than either)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    eps = torch.finfo(want.dtype).eps * (4 if want.dtype == torch.float32 else 1)
    row_scale = normed.float().abs().amax(dim=-1, keepdim=True)
    bound = 2 * eps * (w.abs() + row_scale) + 1e-30
    worst = ((g - w).abs() / bound).max().item()
    assert worst <= 1, f"differs by {worst:.2f}x the rounding bound"


def _skip_rope(feature, lead, d):
    if feature == "rope" and len(lead) < 2:
        pytest.skip("RoPE needs a heads axis")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("lead,d", SHAPES)
@pytest.mark.parametrize("feature", FEATURES)
def test_kernel_matches_reference_interpreted(feature, lead, d, dtype):
    import minikv.kernels as k
    if not k.INTERPRETED:
        pytest.skip("compiled mode: the GPU test below covers it")
    _skip_rope(feature, lead, d)
    x, weight, kw = case(feature, lead, d, dtype, "cpu")
    assert_within_rounding(rms_norm(x, weight, 1e-6, **kw), rms_norm_reference(x, weight, 1e-6, **kw),
                           rms_norm_reference(x, weight, 1e-6))


@pytest.mark.parametrize("feature", FEATURES)
def test_reference_is_the_models_torch_path(feature):
    """The reference is, bit for bit, what the model's norm computes with torch ops (on a CPU, or in training)."""
    from minikv.models.gemma4 import Gemma4RMSNorm
    x, weight, kw = case(feature, (2, 5, 4), 64, torch.float16, "cpu")
    norm = Gemma4RMSNorm(64, 1e-6, with_scale=weight is not None).to(torch.float16)
    if weight is not None:
        norm.weight.data.copy_(weight)
    with torch.no_grad():
        assert torch.equal(norm(x, **kw), rms_norm_reference(x, weight, 1e-6, **kw))


def test_scale_is_the_models_separate_product():
    """scale= multiplies the finished output, rounded as the model's former `x * layer_scalar` step was."""
    x, weight, kw = case("scaled residual", (3, 5), 64, torch.bfloat16, "cpu")
    scale = kw.pop("scale")
    assert torch.equal(rms_norm_reference(x, weight, 1e-6, scale=scale, **kw),
                       rms_norm_reference(x, weight, 1e-6, **kw) * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("lead,d", [((1,), 16), ((7,), 96), ((3,), 1536), ((2, 5), 256)])
@pytest.mark.parametrize("feature", ["plain", "residual", "scaled residual"])
def test_next_norm_is_a_second_launch_bit_for_bit_interpreted(feature, lead, d, dtype):
    """next_weight= gives the norm of the output as a second launch on that output would: the same bits (the model
    relies on it: its norm pairs became one launch), and both within rounding of the reference pair."""
    import minikv.kernels as k
    if not k.INTERPRETED:
        pytest.skip("compiled mode: the GPU test below covers it")
    x, weight, kw = case(feature, lead, d, dtype, "cpu")
    after = (torch.randn(d, generator=torch.Generator().manual_seed(1)) * 0.1 + 1).to(dtype)
    out, nxt = rms_norm(x, weight, 1e-6, next_weight=after, **kw)
    assert torch.equal(out, rms_norm(x, weight, 1e-6, **kw))
    assert torch.equal(nxt, rms_norm(out, after, 1e-6))
    assert_within_rounding(nxt, rms_norm_reference(out, after, 1e-6), rms_norm_reference(out, None, 1e-6))


QKV_SHAPES = [(1, 8, 1, 256), (3, 8, 1, 512), (5, 4, 2, 64), (64, 8, 1, 256)]     # (tokens, q heads, kv heads, D)


def qkv_case(tokens, q_heads, kv_heads, d, dtype, device):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(tokens, q_heads + 2 * kv_heads, d, generator=gen) * 3).to(dtype).to(device)
    wq, wk = ((torch.randn(d, generator=gen) * 0.1 + 1).to(dtype).to(device) for _ in "qk")
    angles = torch.rand(tokens, d, generator=gen) * 6.28
    return x, wq, wk, angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


def assert_qkv_is_three_launches(tokens, q_heads, kv_heads, d, dtype, device):
    """kv=: a layer's q, k and v norms in one launch give the bits of three in a 16-bit dtype (q's and k's with
    their weights and RoPE, v's with neither: float32 keeps the last bits of the mean's sum, whose order moves with
    the launch's row count), and are within rounding of the reference."""
    x, wq, wk, cos, sin = qkv_case(tokens, q_heads, kv_heads, d, dtype, device)
    got = rms_norm(x, wq, 1e-6, cos=cos, sin=sin, kv=(wk, kv_heads))
    q, k, v = x.split([q_heads, kv_heads, kv_heads], dim=-2)
    three = [rms_norm(q, wq, 1e-6, cos=cos, sin=sin), rms_norm(k, wk, 1e-6, cos=cos, sin=sin), rms_norm(v, None, 1e-6)]
    if dtype != torch.float32 or device == "cpu":
        assert torch.equal(got, torch.cat(three, dim=-2))
    assert_within_rounding(got, rms_norm_reference(x, wq, 1e-6, cos=cos, sin=sin, kv=(wk, kv_heads)),
                           rms_norm_reference(x, None, 1e-6) * 1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", QKV_SHAPES[:3])
def test_qkv_norms_are_three_launches_interpreted(shape, dtype):
    import minikv.kernels as k
    if not k.INTERPRETED:
        pytest.skip("compiled mode: the GPU test below covers it")
    assert_qkv_is_three_launches(*shape, dtype, "cpu")


@pytest.mark.parametrize("bad", [dict(kv=(torch.ones(8), 0)), dict(kv=(torch.ones(8), 1)), dict(kv=(torch.ones(7), 1)),
                                 dict(kv=(torch.ones(8), 1), cos=None, sin=None)])
def test_bad_qkv_arguments_are_refused_clearly(bad):
    args = dict(cos=torch.ones(3, 8), sin=torch.ones(3, 8)) | bad
    for fn in (rms_norm, rms_norm_reference):
        with pytest.raises(InvalidValueError, match="kv"):
            fn(torch.ones(3, 2, 8), torch.ones(8), 1e-6, **args)


def test_model_norm_pairs_match_separate_norms_on_cpu():
    """Gemma4RMSNorm(then=...) on a CPU is the two torch norms, bit for bit (dense mode and training)."""
    from minikv.models.gemma4 import Gemma4RMSNorm
    x, weight, kw = case("scaled residual", (2, 5), 64, torch.bfloat16, "cpu")
    first, second = (Gemma4RMSNorm(64, 1e-6).to(torch.bfloat16) for _ in range(2))
    second.weight.data.mul_(0.5)
    with torch.no_grad():
        out, nxt = first(x, then=second, **kw)
        assert torch.equal(out, first(x, **kw)) and torch.equal(nxt, second(out))


def test_zero_rows_give_an_empty_result():
    x = torch.empty(0, 32)
    assert rms_norm(x, None, 1e-6).shape == (0, 32)


@pytest.mark.parametrize("bad,error", [
    (dict(x=torch.arange(4)), InvalidTypeError),
    (dict(eps=0.0), InvalidValueError),
    (dict(weight=torch.ones(7)), InvalidValueError),
    (dict(cos=torch.ones(3, 8)), InvalidValueError),                                # sin missing
    (dict(cos=torch.ones(3, 8), sin=torch.ones(3, 8), residual=torch.ones(3, 2, 8)), InvalidValueError),
    (dict(cos=torch.ones(3, 8, dtype=torch.float64), sin=torch.ones(3, 8, dtype=torch.float64)), InvalidValueError),
    (dict(x=torch.ones(3, 2, 7), weight=None, cos=torch.ones(3, 7), sin=torch.ones(3, 7)), InvalidValueError),
    (dict(residual=torch.ones(3, 2, 8, dtype=torch.float64)), InvalidValueError),
    (dict(scale=torch.ones(2)), InvalidValueError),
    (dict(scale=torch.ones(1, dtype=torch.float64)), InvalidValueError),
    (dict(scale=0.5), InvalidValueError),
])
def test_bad_arguments_are_refused_clearly(bad, error):
    args = dict(x=torch.ones(3, 2, 8), weight=torch.ones(8), eps=1e-6) | bad
    for fn in (rms_norm, rms_norm_reference):
        with pytest.raises(error):
            fn(**args)


@pytest.mark.parametrize("bad", [dict(next_weight=torch.ones(7)), dict(next_weight=[1.0] * 8),
                                 dict(next_weight=torch.ones(8), cos=torch.ones(3, 8), sin=torch.ones(3, 8))])
def test_bad_next_weight_is_refused_clearly(bad):
    with pytest.raises(InvalidValueError, match="next_weight|next norm"):
        rms_norm(torch.ones(3, 2, 8), torch.ones(8), 1e-6, **bad)


# ---- compiled on CUDA ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lead,d", SHAPES + [((64, 8), 512), ((16384,), 1536)])
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_matches_reference_on_gpu(feature, lead, d, dtype):
    _skip_rope(feature, lead, d)
    x, weight, kw = case(feature, lead, d, dtype, "cuda")
    assert_within_rounding(rms_norm(x, weight, 1e-6, **kw), rms_norm_reference(x, weight, 1e-6, **kw),
                           rms_norm_reference(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lead,d", [((1,), 1536), ((64,), 1536), ((7,), 96), ((16384,), 1536), ((3, 5), 256)])
@pytest.mark.parametrize("feature", ["plain", "residual", "scaled residual"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_next_norm_is_a_second_launch_bit_for_bit_on_gpu(feature, lead, d, dtype):
    """Compiled, the fused pair gives the bits of two launches: the engine's tokens do not move with the fusion."""
    x, weight, kw = case(feature, lead, d, dtype, "cuda")
    after = (torch.randn(d, generator=torch.Generator().manual_seed(1)) * 0.1 + 1).to(dtype).cuda()
    out, nxt = rms_norm(x, weight, 1e-6, next_weight=after, **kw)
    assert torch.equal(out, rms_norm(x, weight, 1e-6, **kw))
    assert torch.equal(nxt, rms_norm(out, after, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", QKV_SHAPES)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qkv_norms_are_three_launches_on_gpu(shape, dtype):
    assert_qkv_is_three_launches(*shape, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_model_with_fused_norms_is_as_accurate_as_the_torch_norms_on_gpu():
    """The E2B-like model (10 layers, random weights) in bfloat16 on CUDA, against the same weights in float32: the
    fused norms (inference) stay as close to float32 as the torch formula (taken where gradients are on) does,
    and pick the same greedy tokens nearly everywhere. (A random model amplifies a last-bit difference through its
    layers, so fused and torch bfloat16 logits are compared through their distance to float32, not to each
    other.)"""
    import copy
    from minikv.bench.sdpa_step import e2b_like_model
    model = e2b_like_model("cuda", num_hidden_layers=10, num_kv_shared_layers=4)
    exact = copy.deepcopy(model).float()
    ids = torch.randint(model.config.vocab_size, (4, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    with torch.enable_grad():
        plain = model.compute_logits(model(ids))
        want = exact.compute_logits(exact(ids))
    with torch.no_grad():
        fused = model.logits(ids)
    err_fused, err_plain = ((x - want).abs().max().item() for x in (fused, plain))
    assert err_fused <= 1.5 * err_plain + 1e-3, (err_fused, err_plain)
    assert (fused.argmax(-1) == plain.argmax(-1)).float().mean().item() >= 0.9
