"""The transformers peer of `minikv bench engine` (minikv.bench.transformers_peer), at tiny dimensions on CPU: the
checkpoint transformers saves loads in minikv, both engines run the same token ids, and the rows and targets come
out; importing the bench does not import transformers."""
from __future__ import annotations

import subprocess
import sys

import pytest

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=10, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=16, num_kv_shared_layers=5,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=256)


def test_the_peer_rows_on_cpu(tmp_path):
    pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
    from minikv.bench import transformers_peer as tp
    tp.build_checkpoint(tmp_path, device="cpu", **TINY)
    lines = []
    rows = tp.peer_rows(tmp_path, batch=2, context=24, new_tokens=3, device="cpu", log=lines.append)
    assert [r["engine"].split(" ")[0] for r in rows] == ["transformers", "minikv,", "minikv,"]
    assert all(r["prefill_tokens_per_s"] > 0 and r["decode_ms_per_step"] > 0 for r in rows) and len(lines) == 3
    targets = tp.peer_targets(rows)
    assert len(targets) == 4 and all(goal == 1.0 and ratio > 0 for _, ratio, goal in targets)


@pytest.mark.slow
def test_the_compiled_static_cache_row_on_cpu(tmp_path):
    """transformers' static cache with its compiled decoding forward generates the eager row's tokens and gets its
    own decode target (slow: torch.compile takes about a minute on CPU; the rows and targets themselves are the
    default test's, above)."""
    pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
    from minikv.bench import transformers_peer as tp
    tp.build_checkpoint(tmp_path, device="cpu", **TINY)
    lines = []
    rows = tp.peer_rows(tmp_path, batch=2, context=24, new_tokens=3, device="cpu", log=lines.append, compiled=True)
    assert [r["engine"].split(",")[0].split(" ")[0] for r in rows] == ["transformers"] * 2 + ["minikv"] * 2
    assert rows[1]["engine"].endswith("static cache, compiled") and rows[1]["same_tokens_as_eager"] is True
    assert "tokens as eager" in lines[1]
    decode_targets = [what for what, _, _ in tp.peer_targets(rows) if what.startswith("decode")]
    assert sum("(static cache, compiled)" in what for what in decode_targets) == 2


def test_the_bench_imports_no_transformers():
    code = "import sys, minikv.bench.engine, minikv.bench.transformers_peer; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
