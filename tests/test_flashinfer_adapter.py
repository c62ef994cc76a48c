"""The FlashInfer adapter's translation, on CPU: a stand-in `flashinfer` module that does what FlashInfer's docs say
its paged wrappers do (NHD pages, indptr / indices / last_page_len, window_left, bottom-right causal, k_scale and
v_scale), in plain torch. With it, minikv's adapter hunts clean and its plants are found; the real kernels are
hunted on the GPU (tests/test_backend_hunt.py, marked gpu)."""
from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest
import torch

from minikv.hunt.backend_hunt import hunt_backend
from minikv.hunt.plants import PLANTS, Planted


class _Wrapper:
    def __init__(self, workspace, layout, use_tensor_cores=False, backend="auto"):
        assert layout == "NHD" and workspace.dtype == torch.uint8

    def plan(self, *args, causal=True, pos_encoding_mode="NONE", window_left=-1, q_data_type=None, kv_data_type=None,
             sm_scale=None):
        if len(args) == 8:      # decode: (indptr, indices, last, Hq, Hkv, D, page) has 7; prefill has qo_indptr first
            self.qo = args[0].tolist()
            args = args[1:]
        else:
            self.qo = None
            causal = True
        indptr, indices, last, _, _, _, self.page = args
        assert all(1 <= n <= self.page for n in last.tolist())
        self.pages = [indices[a:b].long() for a, b in zip(indptr[:-1].tolist(), indptr[1:].tolist())]
        self.lens = [(len(p) - 1) * self.page + n for p, n in zip(self.pages, last.tolist())]
        self.causal, self.window_left, self.sm_scale, self.kv_dtype = causal, window_left, sm_scale, kv_data_type

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        k_cache, v_cache = paged_kv_cache
        assert k_cache.stride() == v_cache.stride(), "k/v strides must be identical"
        assert k_cache.dtype == self.kv_dtype
        qo = self.qo or list(range(q.shape[0] + 1))
        out = torch.empty_like(q)
        for b, (pages, length) in enumerate(zip(self.pages, self.lens)):
            k = k_cache[pages].flatten(0, 1)[:length].float() * (k_scale or 1.0)
            v = v_cache[pages].flatten(0, 1)[:length].float() * (v_scale or 1.0)
            rows = q[qo[b]:qo[b + 1]].float()
            group = rows.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            s = torch.einsum("qhd,khd->hqk", rows, k) * self.sm_scale
            i = torch.arange(rows.shape[0])[:, None] + length - rows.shape[0]
            j = torch.arange(length)[None, :]
            hide = (j > i) if self.causal else torch.zeros_like(j > i)
            if self.window_left >= 0:
                hide = hide | (j < i - self.window_left)
            s = s.masked_fill(hide, float("-inf"))
            out[qo[b]:qo[b + 1]] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(q.dtype)
        return out


@pytest.fixture
def stand_in(monkeypatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = fake.BatchPrefillWithPagedKVCacheWrapper = _Wrapper
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.delitem(sys.modules, "minikv.attention.backends.flashinfer", raising=False)
    module = importlib.import_module("minikv.attention.backends.flashinfer")
    backend = module.Backend()
    backend.features = dataclasses.replace(backend.features, device="cpu", head_sizes=(64,))
    yield backend
    sys.modules.pop("minikv.attention.backends.flashinfer", None)


def test_page_lists_follow_flashinfers_convention(stand_in):
    from minikv.attention.backends.flashinfer import page_lists
    tables = torch.tensor([[3, 7, 0], [9, 1, 2]], dtype=torch.int32)
    indptr, indices, last = page_lists(tables, torch.tensor([16, 17], dtype=torch.int32), 8)
    assert indptr.tolist() == [0, 2, 5] and indices.tolist() == [3, 7, 9, 1, 2] and last.tolist() == [8, 1]


def test_the_adapter_hunts_clean_through_the_stand_in(stand_in):
    report = hunt_backend(stand_in, budget_s=None, max_scenarios=48)
    assert not report.found, report.text()
    by_name = {f.name: f for f in report.families}
    assert by_name["fp8-scales"].outcome == "pass" and "not int8_per_token_head" in by_name["fp8-scales"].why


@pytest.mark.parametrize("plant", PLANTS)
def test_plants_in_the_adapter_are_found_through_the_stand_in(stand_in, plant):
    report = hunt_backend(Planted(stand_in, plant, "flashinfer"), budget_s=60, stop_at_first=True)
    assert report.found, report.text()
    assert report.first_finding().seconds_to_find < 60
