"""Training runs end to end (a few steps), is seeded, and its K/V fake quantization matches the cache formats."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from minikv.models import registry, train


@pytest.fixture
def tiny_recipes(monkeypatch):
    """Small batches, one thread: a smoke test should take seconds even on a busy two-core machine."""
    for name, recipe in list(train.RECIPES.items()):
        monkeypatch.setitem(train.RECIPES, name, replace(recipe, batch_size=4, seq_len=min(recipe.seq_len, 40)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", registry.TRAINED_MODELS)
def test_a_few_training_steps_save_loadable_weights(name, tmp_path, tiny_recipes):
    metrics = train.train(name, steps=3, seed=3, out_dir=tmp_path, progress=False, evaluate=False)
    assert metrics["steps"] == 3 and math.isfinite(metrics["final_loss"]) and metrics["torch_threads"] == 1
    assert metrics["recipe"]["batch_size"] == 4
    model = registry.load_model(name, weights_dir=tmp_path)
    assert model.config == registry.model_config(name)
    torch.manual_seed(3)                                   # train() seeds the same way before building
    initial = registry.build_model(name).state_dict()
    changed = [k for k, v in initial.items() if not torch.equal(v.half().float(), model.state_dict()[k].float())]
    assert len(changed) > len(initial) // 2                # the steps moved the weights
    again = tmp_path / "again"
    train.train(name, steps=3, seed=3, out_dir=again, progress=False, evaluate=False)
    assert registry.weights_path(name, tmp_path).read_bytes() == registry.weights_path(name, again).read_bytes()


def test_training_rejects_bad_arguments():
    with pytest.raises(ValueError, match="steps must be at least 1"):
        train.train("tiny-t5", steps=0, progress=False)
    with pytest.raises(registry.ModelLoadError, match="unknown model"):
        train.train("tiny-gpt", steps=1, progress=False)
    with pytest.raises(ValueError, match="random weights, not trained"):
        train.train("tiny-gemma4-e2b", steps=1, progress=False)


@pytest.mark.parametrize("fmt,rel_tol", [("int8_per_token_head", 0.5 / 127), ("fp8_per_token_head", 1 / 16)])
def test_per_token_head_fake_quant_error(fmt, rel_tol):
    x = torch.randn(50, 2, 32) * 3
    q = train.fake_quantize(x, fmt)
    amax = x.abs().amax(-1, keepdim=True)
    if fmt.startswith("int8"):
        assert ((q - x).abs() <= amax * rel_tol * 1.0001).all()
    else:                                     # e4m3: 3 mantissa bits, relative error <= 1/16 above subnormals
        big = x.abs() > amax / 448 * 2 ** -6 * 8
        assert (((q - x).abs() / x.abs())[big] <= rel_tol * 1.0001).all()
    torch.testing.assert_close(q.abs().amax(-1, keepdim=True), amax)   # the largest element is exact


def test_fp8_layer_scale_fake_quant_saturates_and_rounds():
    x = torch.tensor([500.0, -1000.0, 1.0625, 1.1875, 0.3])
    q = train.fake_quantize(x, "fp8")
    assert q.tolist()[:4] == [448.0, -448.0, 1.0, 1.25]     # saturate; ties to even
    assert abs(q[4].item() - 0.3) / 0.3 < 1 / 16


def test_fake_quant_gradient_is_straight_through():
    x = torch.randn(4, 2, 16, requires_grad=True)
    train.fake_quantize(x, "fp8").sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(ValueError, match="unknown fake-quant format"):
        train.fake_quantize(x, "int4")
    with pytest.raises(ValueError, match="kv_fake_quant must be None or one of"):
        train.evaluate_dense("tiny-gemma4", n=1, kv_fake_quant="int4")
