"""The documentation site builds offline with `mkdocs build --strict` (any warning fails), into a temp folder.

Also checks what the build hook adds: a page for every notebook that exists, and API pages generated from the
docstrings; and that the pages render as written: exactly one top-level heading each (a wrapped line starting
with `#123` would become a second one), every figure embedded and present in the site as a PNG, links to the
notebooks, the glossary and upstream. The site is made of NAME.html files (`use_directory_urls: false`), so it
browses from disk; a crawler over every built page checks that every link and image resolves to a file in the
site (and every #anchor to an id on its page), the links inside the rendered notebooks included. The figures on
the pages open at full size on click, and are no wider than the column they are drawn for. The code-site diffs
on the defect pages are generated from the code; exercise solutions in the rendered notebooks are folded.
tests/test_browser_lab.py opens the same pages in Chromium. One build serves every test of the session.
"""
from __future__ import annotations

import fcntl
import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

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


def build_site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` once per test run (skips when the docs extras are missing); also used by the browser
    test. The pytest-xdist workers of one run share the build: the first builds it under a lock in the run's
    common temporary directory, the others wait and read it. Tests only read the site."""
    for module in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[docs]')")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                       # gw0/, gw1/ ... sit side by side in one directory per run
    site, built = root / "docs-site", root / "docs-site.built"
    with open(root / "docs-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
            result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                                    cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
            assert result.returncode == 0, \
                f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            built.touch()
    return site


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    return build_site(tmp_path_factory)


class _PageParser(HTMLParser):
    """The h1 headings, <img> sources (and the link around each), link targets, every href/src with its tag, and
    the ids of one built page."""

    def __init__(self):
        super().__init__()
        self.h1, self.images, self.links, self._in_h1 = [], [], [], False
        self.refs, self.ids, self.image_links, self._link = [], set(), [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key):
                self.refs.append((tag, attrs[key]))
        if tag == "h1":
            self.h1.append("")
            self._in_h1 = True
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
            self.image_links.append(self._link)
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "a":
            self._link = attrs.get("href")

    def handle_endtag(self, tag):
        if tag == "h1":
            self._in_h1 = False
        elif tag == "a":
            self._link = None

    def handle_data(self, data):
        if self._in_h1:
            self.h1[-1] += data


def page_file(site: Path, page: str) -> Path:
    """The built file of a page: "" is the home page; "defects/scale-wipe" is site/defects/scale-wipe.html."""
    return site / (f"{page}.html" if page else "index.html")


def parse_page(site: Path, page: str) -> _PageParser:
    parser = _PageParser()
    parser.feed(page_file(site, page).read_text())
    return parser


def crawl(site: Path) -> tuple[int, list[str]]:
    """Every href and src of every page of the built site, resolved as a browser does from the page's own folder:
    (pages crawled, problems). A problem is a target that is not a file of the site (or escapes it), a link to a
    folder (it does not open from file://), or a #fragment that names no id on its page. External links
    (http:, https:, mailto:, data:) are not followed. Root-absolute links are allowed on 404.html only, which a
    web server shows from any path and which is never reached from disk."""
    site = site.resolve()
    parsed = {}
    for page in sorted(site.rglob("*.html")):
        parser = _PageParser()
        parser.feed(page.read_text(errors="replace"))
        parsed[page] = parser
    problems = []
    for page, parser in parsed.items():
        where = page.relative_to(site)
        for tag, ref in parser.refs:
            parts = urlsplit(ref)
            if parts.scheme or ref.startswith("//"):
                continue
            path = unquote(parts.path)
            if path.startswith("/"):
                if page.name != "404.html":
                    problems.append(f"{where}: {tag} {ref!r} is root-absolute (breaks from file://)")
                target = site / path.lstrip("/")
            else:
                target = page.parent / path if path else page
            target = Path(os.path.normpath(target))
            if target.is_dir():
                problems.append(f"{where}: {tag} {ref!r} points at a folder (does not open from file://)")
                continue
            if site not in target.parents or not target.is_file():
                problems.append(f"{where}: {tag} {ref!r} -> {target} is not a file of the site")
                continue
            if parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parsed[target].ids:
                problems.append(f"{where}: {ref!r}: {target.relative_to(site)} has no id {parts.fragment!r}")
    return len(parsed), problems


def test_docs_build_strict(built_site):
    index = (built_site / "index.html").read_text()
    assert "minikv" in index
    for page in ("concepts/paged-kv-cache", "concepts/kv-cache-formats", "concepts/kv-sharing",
                 "concepts/cross-attention", "defects/scale-wipe", "defects/cross-stride-fp8-context"):
        assert page_file(built_site, page).exists(), page


def test_every_link_and_image_of_the_site_resolves_to_a_file_in_it(built_site):
    pages, problems = crawl(built_site)
    assert pages > 20, f"only {pages} pages built"
    assert not problems, f"{len(problems)} broken reference(s):\n" + "\n".join(problems[:40])


def test_crawler_catches_a_missing_page_a_folder_link_and_a_missing_anchor(tmp_path):
    """The crawler itself must fail on what breaks a site on disk, or the test above could never fail."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b.html").write_text('<p id="here">b</p>')
    (tmp_path / "index.html").write_text('<a href="b.html#here">ok</a><a href="missing.html">x</a>'
                                         '<a href="a/">dir</a><a href="b.html#nowhere">y</a><img src="fig.png">'
                                         '<a href="https://example.com/">external</a>')
    _, problems = crawl(tmp_path)
    assert len(problems) == 4, problems
    assert any("missing.html" in p for p in problems) and any("folder" in p for p in problems)
    assert any("nowhere" in p for p in problems) and any("fig.png" in p for p in problems)


def test_notebook_links_point_at_the_sites_pages(built_site):
    """Links written for the repository (../docs/concepts/x.md, 02_y.ipynb) become the pages of the site."""
    for stem in NOTEBOOK_STEMS:
        if not (REPO / "notebooks" / f"{stem}.ipynb").exists():
            continue
        links = parse_page(built_site, f"notebooks/{stem}").links
        assert not [link for link in links if link.endswith((".md", ".ipynb")) or ".md#" in link
                    or "../docs/" in link], f"{stem}: links left as repository paths"


def test_figures_open_at_full_size_and_fit_the_column(built_site):
    """Every figure of a concept, defect or notebook page is a link to its PNG, and no wider than the column the
    figures are drawn for (minikv.viz.SHOWN_WIDTH_PX), so the page never shrinks its text."""
    from minikv.viz import SHOWN_WIDTH_PX

    pages = [*CONCEPT_PAGES, *DEFECT_PAGES, *[f"notebooks/{s}" for s in NOTEBOOK_STEMS
                                              if (REPO / "notebooks" / f"{s}.ipynb").exists()]]
    too_wide, unlinked = [], []
    for page in pages:
        parsed = parse_page(built_site, page)
        for src, link in zip(parsed.images, parsed.image_links):
            if not src.endswith(".png"):
                continue
            if link != src:
                unlinked.append(f"{page}: {src}")
            data = (page_file(built_site, page).parent / src).read_bytes()
            width = int.from_bytes(data[16:20], "big")
            if width > SHOWN_WIDTH_PX + 1:
                too_wide.append(f"{page}: {src} is {width} px")
    assert not unlinked, "figures that do not open at full size on click:\n" + "\n".join(unlinked)
    assert not too_wide, (f"figures wider than the {SHOWN_WIDTH_PX}-px column they are drawn for (the page would "
                          "shrink their text):\n" + "\n".join(too_wide))


def test_defect_pages_show_the_code_site_diffs_generated_from_the_code(built_site):
    from minikv.repro import scale_wipe

    page = page_file(built_site, "defects/scale-wipe").read_text()
    # Rendered as a diff: the header, removed lines (gd) and added lines (gi) highlighted.
    assert "code-diff:" not in page and page.count('<span class="gd">---') == 1 and '<span class="gi">+' in page
    first_fix_line = next(line for line in scale_wipe.code_site_diff().splitlines()
                          if line.startswith("+") and not line.startswith("+++") and line[1:].strip())
    assert html.escape(first_fix_line[1:].strip(), quote=False) in page
    cross = page_file(built_site, "defects/cross-stride-fp8-context").read_text()
    assert cross.count('<span class="gd">---') == 3 and "code-diff:" not in cross


def test_notebook_solutions_are_folded(built_site):
    for stem in NOTEBOOK_STEMS:
        path = REPO / "notebooks" / f"{stem}.ipynb"
        if not path.exists():
            continue
        cells = json.loads(path.read_text())["cells"]
        solutions = [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
        page = page_file(built_site, f"notebooks/{stem}").read_text()
        assert page.count('<details class="minikv-solution" data-search-exclude="">') == len(solutions), stem


def _site_text(html_text: str, keep_solutions: bool) -> str:
    """The visible text of a built page, with or without its folded solutions."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html_text, "html.parser")
    for tag in soup.find_all(["script", "style"]):
        tag.decompose()
    if not keep_solutions:
        for details in soup.find_all("details", class_="minikv-solution"):
            details.decompose()
    return soup.get_text(" ")


def _solution_outputs(notebook: Path) -> str:
    """The recorded outputs of a notebook's solution cells."""
    from test_exercises import _output

    return "\n".join(_output(c) for c in json.loads(notebook.read_text())["cells"]
                     if "solution" in c.get("metadata", {}).get("tags", []))


def test_solutions_are_sealed_in_the_built_site(built_site):
    """The built site shows an exercise's answer only inside a folded solution, and its search index (which the
    offline plugin also embeds in the pages) holds no folded solution: not a notebook's "answer:" line, not a
    sentence of a docs page's solution block."""
    from test_exercises import DOCS_SHOWN_ON_PURPOSE, NOTEBOOKS, _shows, exercise_answers

    index = json.loads((built_site / "search" / "search_index.json").read_text())
    indexed = " ".join(" ".join((doc.get("title", ""), doc.get("text", ""))) for doc in index["docs"])
    indexed = re.sub(r"<[^>]+>", " ", html.unescape(indexed))
    indexed = re.sub(r"\s+", " ", indexed)
    printed = [re.sub(r"\s+", " ", line).strip() for notebook in NOTEBOOKS
               for line in re.findall(r"^answer: .+$", _solution_outputs(notebook), re.MULTILINE)]
    assert printed and not [line for line in printed if line in indexed]
    pages = {page: page.read_text() for page in sorted(built_site.rglob("*.html"))
             if "api" not in page.relative_to(built_site).parts}
    sealed = 0
    from bs4 import BeautifulSoup
    for page, text in pages.items():
        visible = re.sub(r"\s+", " ", _site_text(text, keep_solutions=False))
        for details in BeautifulSoup(text, "html.parser").find_all("details", class_="minikv-solution"):
            assert details.has_attr("data-search-exclude"), f"{page.name}: a solution the search index would hold"
            for sentence in re.split(r"(?<=[.:;])\s", re.sub(r"\s+", " ", details.get_text(" "))):
                if len(sentence) > 60 and sentence.strip() not in visible:     # text only the solution holds
                    sealed += 1
                    assert sentence.strip() not in indexed, f"{page.name}: the search index holds {sentence!r}"
    assert sealed > 0
    shown = {page: _site_text(text, keep_solutions=False) for page, text in pages.items()
             if "notebooks" not in page.relative_to(built_site).parts}
    leaks = [f"{page.relative_to(built_site)} shows {form!r} ({notebook.stem}, exercise {n})"
             for notebook in NOTEBOOKS for n, forms in exercise_answers(notebook)
             if (notebook.stem[:2], n) not in DOCS_SHOWN_ON_PURPOSE
             for form in forms for page, text in shown.items() if _shows(form, text)]
    assert not leaks, "\n".join(leaks)


def test_api_pages_come_from_docstrings(built_site):
    cache_page = (built_site / "api" / "minikv.cache.html").read_text()
    assert 'id="minikv.cache.layout.KVLayout"' in cache_page
    assert "the one place where the bytes of a KV-cache pool are computed" in cache_page
    viz_page = (built_site / "api" / "minikv.viz.html").read_text()
    assert 'id="minikv.viz.quantized.scale_heatmap"' in viz_page
    repro_page = (built_site / "api" / "minikv.repro.html").read_text()
    assert 'id="minikv.repro.scale_wipe.run.run_engine"' in repro_page


@pytest.mark.parametrize("stem", NOTEBOOK_STEMS)
def test_existing_notebooks_are_rendered_with_outputs(built_site, stem):
    if not (REPO / "notebooks" / f"{stem}.ipynb").exists():
        pytest.skip(f"notebooks/{stem}.ipynb does not exist yet")
    page = built_site / "notebooks" / f"{stem}.html"
    assert page.exists(), f"no page for notebooks/{stem}.ipynb"
    rendered_outputs = page.read_text().count('<div class="jp-OutputArea-child')
    assert rendered_outputs > 0, f"notebooks/{stem}.ipynb is rendered without outputs"


def test_no_markdown_line_starts_with_hash_number():
    """A wrapped line such as `#51061), found ...` is a heading to Markdown, not the rest of a sentence."""
    sources = [*sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("*.md"))]
    bad = [f"{path.relative_to(REPO)}:{number}: {line}" for path in sources
           for number, line in enumerate(path.read_text().splitlines(), 1) if re.match(r" {0,3}#+\d", line)]
    assert not bad, "lines that Markdown reads as headings:\n" + "\n".join(bad)


# The words the notebooks use without explaining them each have a glossary entry (### heading).
GLOSSARY_TERMS = ("BOS", "GQA", "amax", "e4m3", "slot", "row", "pool", "arena", "canary", "impl", "census", "FMHA",
                  "golden output", "backend matrix", "oracle", "sm89", "CUDA graph",
                  "workspace", "sliding window", "KV sharing", "relative position bias", "stride", "page / paged",
                  "slot mapping", "element size", "storage and view", "encoder-decoder and cross attention", "FP8")


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
        png = (page_file(built_site, page).parent / src).resolve()
        assert png.is_file(), f"{page}: {src} is not in the built site"
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") > 0, f"{src} is no PNG"
    stem = PAGE_NOTEBOOK[page]
    assert any(link.endswith(f"notebooks/{stem}.html") for link in parsed.links), (
        f"{page} does not link its notebook {stem}")
    assert any("glossary" in link for link in parsed.links), f"{page} does not link the glossary"


def test_notebook_pages_link_back_to_the_docs(built_site):
    for page, stem in PAGE_NOTEBOOK.items():
        if not (REPO / "notebooks" / f"{stem}.ipynb").exists():
            continue
        links = parse_page(built_site, f"notebooks/{stem}").links
        assert any(link.endswith(f"{page}.html") for link in links), f"notebook {stem} does not link to {page}"


def test_defect_pages_link_upstream(built_site):
    links = {page: parse_page(built_site, page).links for page in DEFECT_PAGES}
    assert {"https://github.com/vllm-project/vllm/issues/50702",
            "https://github.com/vllm-project/vllm/issues/50749"} <= set(links["defects/scale-wipe"])
    assert {"https://github.com/NVIDIA/TensorRT-LLM/pull/20958",
            "https://github.com/NVIDIA/TensorRT-LLM/issues/19861"} <= set(links["defects/cross-stride-fp8-context"])


def test_index_links_glossary_and_notebooks(built_site):
    links = parse_page(built_site, "").links
    assert "glossary.html" in links
    assert sum("notebooks/" in link for link in links) >= 4


def test_build_time_figures_are_deterministic():
    pytest.importorskip("mkdocs")
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    first, second = hooks._viz_figures(), hooks._viz_figures()
    assert first.keys() == second.keys() and all(first[name] == second[name] for name in first)


def test_search_index_is_embedded_for_file_urls(built_site):
    """The offline plugin's search_index.js (which the theme loads from file://) and the local Web Worker
    stand-in, and no script from the network: search then works from disk (the browser test types a query)."""
    assert (built_site / "search" / "search_index.js").read_text().startswith("var __index = ")
    assert (built_site / "javascripts" / "iframe-worker.js").is_file()
    for page in ("", "defects/scale-wipe", "notebooks/06_catching_defects"):
        html = page_file(built_site, page).read_text()
        scripts = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
        assert any(src.endswith("javascripts/iframe-worker.js") for src in scripts), (page, scripts)
        remote = [src for src in scripts if "://" in src or src.startswith("//")]
        assert not remote, f"{page or 'index'} loads scripts from the network: {remote}"


def test_home_lists_every_notebook_and_the_nav_puts_them_early(built_site):
    links = parse_page(built_site, "").links
    stems = sorted(p.stem for p in (REPO / "notebooks").glob("0*.ipynb"))
    missing = [s for s in stems if not any(link.endswith(f"notebooks/{s}.html") for link in links)]
    assert not missing, f"the docs home does not link {missing}"
    import yaml
    nav = [next(iter(item)) for item in yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]]
    assert nav.index("Notebooks") < nav.index("Concepts"), f"nav order: {nav}"


def test_defect_pages_open_with_the_provenance_box(built_site):
    from minikv.defects import provenance
    for page, name in (("defects/scale-wipe", "scale-wipe"), ("defects/cross-stride-fp8-context", "cross-stride")):
        html = page_file(built_site, page).read_text()
        box = html.split('<p class="admonition-title">What upstream said, and when</p>', 1)
        assert len(box) == 2 and html.index("admonition-title") < html.find("<h2"), f"{page}: no box at the top"
        for step in provenance.TIMELINES[name]:
            assert step.url in box[1].split("</div>", 1)[0] or step.url in box[1], (page, step.url)
