"""The documentation site builds offline with `mkdocs build --strict` (any warning fails), into a temp folder.

Also checks what the build hook adds: a page for every notebook that exists, and API pages generated from the
docstrings.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_STEMS = ["01_paged_kv_cache", "02_quantized_kv_cache", "03_kv_sharing_scale_wipe",
                  "04_cross_attention_stride_doubling", "05_gpu_performance"]


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[docs]')")
    site = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return site


def test_docs_build_strict(built_site):
    index = (built_site / "index.html").read_text()
    assert "minikv" in index
    for page in ("concepts/paged-kv-cache", "concepts/kv-cache-formats", "concepts/kv-sharing",
                 "concepts/cross-attention", "defects/scale-wipe", "defects/cross-stride-fp8-context"):
        assert (built_site / page / "index.html").exists(), page


def test_api_pages_come_from_docstrings(built_site):
    cache_page = (built_site / "api" / "minikv.cache" / "index.html").read_text()
    assert 'id="minikv.cache.layout.KVLayout"' in cache_page
    assert "the one place where the bytes of a KV-cache pool are computed" in cache_page
    viz_page = (built_site / "api" / "minikv" / "index.html").read_text()
    assert 'id="minikv.viz.scale_heatmap"' in viz_page


@pytest.mark.parametrize("stem", NOTEBOOK_STEMS)
def test_existing_notebooks_are_rendered_with_outputs(built_site, stem):
    if not (REPO / "notebooks" / f"{stem}.ipynb").exists():
        pytest.skip(f"notebooks/{stem}.ipynb does not exist yet")
    page = built_site / "notebooks" / stem / "index.html"
    assert page.exists(), f"no page for notebooks/{stem}.ipynb"
    rendered_outputs = page.read_text().count('<div class="jp-OutputArea-child')
    assert rendered_outputs > 0, f"notebooks/{stem}.ipynb is rendered without outputs"
