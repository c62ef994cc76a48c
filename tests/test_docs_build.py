"""The documentation site builds offline with `mkdocs build --strict` (any warning fails), into a temp folder.

Also checks what the build hook adds: a page for every notebook that exists, and API pages generated from the
docstrings; and that the pages render as written: exactly one top-level heading each (a wrapped line starting
with `#123` would become a second one), every figure embedded and present in the site as a PNG, links to the
notebooks, the glossary and upstream. tests/test_browser_lab.py opens the same pages in Chromium.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_STEMS = ["01_paged_kv_cache", "02_quantized_kv_cache", "03_kv_sharing_scale_wipe",
                  "04_cross_attention_stride_doubling", "05_gpu_performance"]


CONCEPT_PAGES = ["concepts/paged-kv-cache", "concepts/kv-cache-formats", "concepts/kv-sharing",
                 "concepts/cross-attention"]
DEFECT_PAGES = ["defects/scale-wipe", "defects/cross-stride-fp8-context"]
# The notebook each concept and defect page walks through.
PAGE_NOTEBOOK = {"concepts/paged-kv-cache": "01_paged_kv_cache", "concepts/kv-cache-formats": "02_quantized_kv_cache",
                 "concepts/kv-sharing": "03_kv_sharing_scale_wipe",
                 "concepts/cross-attention": "04_cross_attention_stride_doubling",
                 "defects/scale-wipe": "03_kv_sharing_scale_wipe",
                 "defects/cross-stride-fp8-context": "04_cross_attention_stride_doubling"}


def build_site(site: Path) -> Path:
    """`mkdocs build --strict` into `site` (skips when the docs extras are missing); also used by the browser test."""
    for module in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return site


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    return build_site(tmp_path_factory.mktemp("site"))


class _PageParser(HTMLParser):
    """The h1 headings, <img> sources and link targets of one built page."""

    def __init__(self):
        super().__init__()
        self.h1, self.images, self.links, self._in_h1 = [], [], [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "h1":
            self.h1.append("")
            self._in_h1 = True
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1[-1] += data


def parse_page(site: Path, page: str) -> _PageParser:
    parser = _PageParser()
    parser.feed((site / page / "index.html").read_text())
    return parser


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


def test_no_markdown_line_starts_with_hash_number():
    """A wrapped line such as `#51061), found ...` is a heading to Markdown, not the rest of a sentence."""
    sources = [*sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("*.md"))]
    bad = [f"{path.relative_to(REPO)}:{number}: {line}" for path in sources
           for number, line in enumerate(path.read_text().splitlines(), 1) if re.match(r" {0,3}#+\d", line)]
    assert not bad, "lines that Markdown reads as headings:\n" + "\n".join(bad)


# Issue 14 item 7: the words the notebooks use without explaining them each have a glossary entry (### heading).
GLOSSARY_TERMS = ("BOS", "GQA", "amax", "e4m3", "slot", "row", "pool", "arena", "canary", "impl", "census", "FMHA",
                  "workspace", "sliding window", "KV sharing", "relative position bias")


def test_glossary_defines_the_walkthrough_terms():
    entries = {line[4:].strip().lower() for line in (REPO / "docs" / "glossary.md").read_text().splitlines()
               if line.startswith("### ")}
    missing = [term for term in GLOSSARY_TERMS if term.lower() not in entries]
    assert not missing, f"docs/glossary.md has no entry (### heading) for {missing}"


@pytest.mark.parametrize("page", ["", "glossary", *CONCEPT_PAGES, *DEFECT_PAGES])
def test_page_has_exactly_one_top_level_heading(built_site, page):
    headings = parse_page(built_site, page).h1
    assert len(headings) == 1, f"{page or 'index'}: {len(headings)} <h1> headings: {headings}"


@pytest.mark.parametrize("page", [*CONCEPT_PAGES, *DEFECT_PAGES])
def test_page_shows_its_figures_and_links_notebook_and_glossary(built_site, page):
    parsed = parse_page(built_site, page)
    figures = [src for src in parsed.images if "figures/" in src]
    assert figures, f"{page} embeds no figure"
    for src in figures:
        png = (built_site / page / src).resolve()
        assert png.is_file(), f"{page}: {src} is not in the built site"
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") > 0, f"{src} is no PNG"
    stem = PAGE_NOTEBOOK[page]
    assert any(link.rstrip("/").endswith(f"notebooks/{stem}") for link in parsed.links), (
        f"{page} does not link its notebook {stem}")
    assert any("glossary" in link for link in parsed.links), f"{page} does not link the glossary"


def test_notebook_pages_link_back_to_the_docs(built_site):
    for page, stem in PAGE_NOTEBOOK.items():
        if not (REPO / "notebooks" / f"{stem}.ipynb").exists():
            continue
        links = parse_page(built_site, f"notebooks/{stem}").links
        assert any(link.rstrip("/").endswith(page) for link in links), f"notebook {stem} does not link to {page}"


def test_defect_pages_link_upstream(built_site):
    links = {page: parse_page(built_site, page).links for page in DEFECT_PAGES}
    assert {"https://github.com/vllm-project/vllm/issues/50702",
            "https://github.com/vllm-project/vllm/issues/50749"} <= set(links["defects/scale-wipe"])
    assert {"https://github.com/NVIDIA/TensorRT-LLM/pull/20958",
            "https://github.com/NVIDIA/TensorRT-LLM/issues/19861"} <= set(links["defects/cross-stride-fp8-context"])


def test_index_links_glossary_and_notebooks(built_site):
    links = parse_page(built_site, "").links
    assert "glossary/" in links
    assert sum("notebooks/" in link for link in links) >= 4


def test_build_time_figures_are_deterministic():
    pytest.importorskip("mkdocs")
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    first, second = hooks._viz_figures(), hooks._viz_figures()
    assert first.keys() == second.keys() and all(first[name] == second[name] for name in first)
