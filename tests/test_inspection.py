"""The public inspection properties of LLM: attention layers, KV layout, kernels, model config."""
import torch

import minikv


def test_attention_layers_show_the_sharing_topology():
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", backend="torch")
    layers = llm.attention_layers
    assert list(layers) == [f"model.layers.{i}.self_attn" for i in range(8)]
    for name, layer in layers.items():
        target = layer.kv_sharing_target
        owner = layers[target] if target else layer
        assert layer.kv_cache is owner.kv_cache               # a sharing layer holds its target's tensor object
        assert layer.impl.layout == llm.kv_layout
    sharers = {n for n, a in layers.items() if a.kv_sharing_target}
    assert sharers == {f"model.layers.{i}.self_attn" for i in (4, 5, 6, 7)}
    assert llm.model_config.kv_sharing == {4: 2, 5: 3, 6: 2, 7: 3}
    assert llm.kv_layout.elem_bytes == 1
    assert callable(llm.kernel_ops.decode)


def test_cross_layers_carry_the_layout_their_backend_addresses():
    # float16 activations: the buggy backend believes the cache holds 2-byte elements
    fixed = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", backend="torch", dtype=torch.float16)
    buggy = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", backend="torch", reintroduce=("cross-stride",),
                       repro=minikv.ReproConfig(check_layout=False), dtype=torch.float16)
    for llm, elem in ((fixed, 1), (buggy, 2)):
        cross = [a for a in llm.attention_layers.values() if a.kind == "cross"]
        assert cross and all(a.impl.layout.elem_bytes == elem for a in cross)


def test_kv_layouts_name_every_pool_with_its_layout():
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="fp8_per_token_head", backend="torch")
    layouts = llm.kv_layouts
    owners = [n for n, a in llm.attention_layers.items() if a.kv_sharing_target is None]
    assert list(layouts) == [f"kv.{n}" for n in owners] == list(llm.arena.specs)
    assert all(lay == llm.kv_layout == llm.arena.layout(name) for name, lay in layouts.items())
    layouts.clear()                                          # a copy: the engine's own mapping is untouched
    assert llm.kv_layouts
