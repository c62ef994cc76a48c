"""MkDocs hook (see mkdocs.yml): the parts of the site that follow the code instead of being written by hand.

* Notebooks: each of the five notebooks is added to the "Notebooks" section *if its .ipynb exists*, read from
  notebooks/ in place (mkdocs-jupyter renders it with its recorded outputs). A missing notebook is left out, so
  `mkdocs build --strict` passes while the notebooks are still being written.
* API reference: one generated page per package (minikv, minikv.cache, ..., minikv.kernels), listing every module
  found on disk with a mkdocstrings `:::` block, so a new module shows up without editing the docs.
* Figures: the PNGs the concept and defect pages embed (`docs/figures/NAME.png` in the built site). Each is either
  taken from a notebook's recorded outputs (the figure of the first code cell whose source contains a marker, so
  the docs show exactly what the notebook computed) or drawn at build time by a `minikv.viz` function (Agg,
  fixed size, no timestamp: the same bytes on every build). A figure whose source is gone is a build warning, so
  `mkdocs build --strict` fails rather than showing a broken image.
* Back links: every rendered notebook page starts with links to the docs pages that explain it.
* Provenance: `<!-- provenance: NAME -->` becomes the defect's "What upstream said, and when" box, rendered from
  minikv/defects/provenance.py.
* Sealed solutions: a folded solution (a notebook's solution cell, or a docs page's
  `<details class="success minikv-solution" markdown="1">` block) is left out of the search index.
"""
from __future__ import annotations

import base64
import io
import json
import logging
import posixpath
import re
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.minikv")

NOTEBOOKS = [
    ("01_paged_kv_cache", "1. Paged KV cache"),
    ("02_quantized_kv_cache", "2. Quantized KV cache"),
    ("03_kv_sharing_scale_wipe", "3. KV sharing and the scale wipe"),
    ("04_cross_attention_stride_doubling", "4. Cross-attention stride doubling"),
    ("05_gpu_performance", "5. GPU performance"),
    ("06_catching_defects", "6. Catching defects like these"),
]
# Docs pages that explain each notebook: the notebook's rendered page links back to them.
NOTEBOOK_PAGES = {
    "01_paged_kv_cache": [("Paged KV cache and block tables", "concepts/paged-kv-cache.md")],
    "02_quantized_kv_cache": [("KV cache formats and inline scales", "concepts/kv-cache-formats.md")],
    "03_kv_sharing_scale_wipe": [("KV sharing", "concepts/kv-sharing.md"),
                                 ("Defect A: the scale wipe", "defects/scale-wipe.md")],
    "04_cross_attention_stride_doubling": [("Encoder-decoder cross attention", "concepts/cross-attention.md"),
                                           ("Defect B: cross stride and FP8 context read",
                                            "defects/cross-stride-fp8-context.md")],
    "05_gpu_performance": [("Results", "results.md"), ("Glossary (roofline, SDPA, scale placement)", "glossary.md")],
    "06_catching_defects": [("Catching defects like these: minikv hunt", "hunt.md")],
}
NOTEBOOKS_SECTION = "Notebooks"
API_SECTION = "API reference"


def _repo(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def existing_notebooks(repo: Path) -> list[tuple[str, str]]:
    """[(nav title, docs path)] of the notebooks whose .ipynb exists, in reading order."""
    return [(title, f"notebooks/{stem}.ipynb") for stem, title in NOTEBOOKS
            if (repo / "notebooks" / f"{stem}.ipynb").exists()]


def _modules(package_dir: Path) -> list[str]:
    """Module names (without the package) of a package folder, __init__ first; private and __main__ skipped. A
    subpackage of a subpackage (minikv/repro/scale_wipe/) is listed with its modules ("scale_wipe.run", ...)."""
    names = sorted(p.stem for p in package_dir.glob("*.py") if not p.stem.startswith("_"))
    for sub in sorted(d for d in package_dir.iterdir() if (d / "__init__.py").exists()):
        if package_dir.name != "minikv":          # minikv's own subpackages get pages of their own
            names += [sub.name] + [f"{sub.name}.{p.stem}" for p in sorted(sub.glob("*.py"))
                                   if not p.stem.startswith("_")]
    return (["__init__"] if (package_dir / "__init__.py").exists() else []) + names


def api_pages(repo: Path) -> dict[str, str]:
    """{docs path: markdown} of the API pages: one per package of minikv, plus minikv.kernels."""
    packages = [("minikv", repo / "minikv", "minikv")]
    packages += [(f"minikv.{d.name}", d, f"minikv.{d.name}") for d in sorted((repo / "minikv").iterdir())
                 if d.is_dir() and (d / "__init__.py").exists()]
    # The top-level kernels/ folder is installed as minikv.kernels; the docs read it from disk as `kernels`.
    packages.append(("minikv.kernels", repo / "kernels", "kernels"))
    pages = {}
    for public_name, folder, import_name in packages:
        if not folder.is_dir():
            continue
        lines = [f"# {public_name}", ""]
        if import_name == "kernels":
            lines += ["The `kernels/` folder of the repository, installed under the import name `minikv.kernels`.",
                      ""]
        for module in _modules(folder):
            shown = public_name if module == "__init__" else f"{public_name}.{module}"
            target = import_name if module == "__init__" else f"{import_name}.{module}"
            # A package's __init__ shows its docstring only: its members are documented in their own modules.
            options = ["    options:", "      members: false"] if module == "__init__" or \
                (folder / module).is_dir() else []
            lines += [f"## `{shown}`", "", f"::: {target}", *options, ""]
        pages[f"api/{public_name}.md"] = "\n".join(lines)
    return pages


def _set_section(nav: list, title: str, entries: list) -> list:
    """Replace the nav section called `title` with `entries` (dropped when there are none)."""
    out = []
    for item in nav:
        if isinstance(item, dict) and title in item:
            if entries:
                out.append({title: entries})
        else:
            out.append(item)
    return out


def on_config(config):
    _EXTRA_FILES.clear()
    _EXTRA_BYTES.clear()
    repo = _repo(config)
    notebooks = [{title: path} for title, path in existing_notebooks(repo)]
    api = [{Path(path).stem: path} for path in api_pages(repo)]
    nav = _set_section(config.nav or [], NOTEBOOKS_SECTION, notebooks)
    config.nav = _set_section(nav, API_SECTION, api)
    return config


@event_priority(100)   # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    repo = _repo(config)
    for _, path in existing_notebooks(repo):
        # A plain File whose source folder is the repository (not a generated one: mkdocs-jupyter's wrapper
        # finds the notebook through src_dir).
        files.append(File(path, src_dir=str(repo), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    for path, content in api_pages(repo).items():
        files.append(File.generated(config, path, content=content))
    for name, png in figures(repo).items():
        files.append(File.generated(config, f"figures/{name}.png", content=png))
    return files


# ---- pages: generated diffs, notebook links, figures that open at full size, folded solutions ------------------

# `<!-- code-diff: NAME -->` on a line of its own in a docs page becomes the unified diff HISTORICAL -> FIX of that
# code site, generated from the source at build time (so the page can never show an outdated version).
CODE_DIFF = re.compile(r"^<!-- code-diff: (?P<name>[\w-]+) -->$", re.MULTILINE)


def code_site_diffs() -> dict[str, str]:
    """{name: unified diff} of every HISTORICAL / FIX code site, from the code itself."""
    from minikv.viz import cross_stride as vcs
    from minikv.attention.cross import CrossAttentionImpl, CrossAttentionModule
    from minikv.repro import scale_wipe
    return {
        "scale-wipe": scale_wipe.code_site_diff(),
        "cross-stride-eager": vcs.code_site_diff(CrossAttentionModule.__init__),
        "cross-stride-deferred": vcs.code_site_diff(CrossAttentionModule.create_weights),
        "cross-fp8-context-read": vcs.code_site_diff(CrossAttentionImpl._context_read_layout),
    }


# `<!-- provenance: NAME -->` on a line of its own becomes the "What upstream said, and when" box of that defect,
# rendered from minikv/defects/provenance.py (the one place upstream's numbers, dates and states are kept).
PROVENANCE = re.compile(r"^<!-- provenance: (?P<name>[\w-]+) -->$", re.MULTILINE)


def provenance_box(name: str) -> str:
    """The box as a Material admonition: the title, then the table and minikv's reading, indented."""
    from minikv.defects import provenance
    title, body = provenance.box_markdown(name).split("\n\n", 1)
    note = title.removeprefix("**What upstream said, and when** ").strip()
    inner = f"{note[1:-1].capitalize()}.\n\n{body}" if note.startswith("(") else body
    indented = "\n".join(f"    {line}" if line else "" for line in inner.splitlines())
    return f'!!! info "What upstream said, and when"\n\n{indented}\n'


def on_page_markdown(markdown, page, config, files):
    if "<!-- provenance:" in markdown:
        from minikv.defects import provenance

        def box(match: re.Match) -> str:
            name = match.group("name")
            if name not in provenance.TIMELINES:
                log.warning(f"{page.file.src_uri}: unknown provenance {name!r}; known: {sorted(provenance.TIMELINES)}")
                return match.group(0)
            return provenance_box(name)

        markdown = PROVENANCE.sub(box, markdown)
    if "<!-- code-diff:" not in markdown:
        return markdown
    diffs = code_site_diffs()

    def diff_block(match: re.Match) -> str:
        name = match.group("name")
        if name not in diffs:
            log.warning(f"{page.file.src_uri}: unknown code-diff {name!r}; known: {sorted(diffs)}")
            return match.group(0)
        return f"```diff\n{diffs[name]}\n```"

    return CODE_DIFF.sub(diff_block, markdown)


# Repository files a notebook links to that are not pages of the site (a CSV, a results file): copied into the
# site under repo/ so that the link works offline too. {site path: repository path}, filled while pages render.
_EXTRA_FILES: dict[str, Path] = {}
# Figures taken out of the rendered notebooks (inline base64 PNGs) into files, so they can open at full size.
_EXTRA_BYTES: dict[str, bytes] = {}
HREF = re.compile(r'href="(?P<href>[^"]*)"')


def _rewrite_notebook_link(href: str, page, files, repo: Path) -> str:
    """A relative link inside a notebook (written for the repository: `../docs/x.md`, `02_y.ipynb`) as a link to
    the site's page, or to a copy of the repository file under repo/; unknown targets are a build warning."""
    if not href or href.startswith(("#", "mailto:", "//")) or "://" in href:
        return href
    path, _, fragment = href.partition("#")
    target = posixpath.normpath(posixpath.join("notebooks", path))
    docs_path = target.removeprefix("docs/") if target.startswith("docs/") else target
    site_file = files.get_file_from_path(docs_path)
    suffix = f"#{fragment}" if fragment else ""
    if site_file is not None:
        return get_relative_url(site_file.url, page.url) + suffix
    source = repo / target
    if source.is_file():
        dest = f"repo/{target}"
        _EXTRA_FILES[dest] = source
        return get_relative_url(dest, page.url) + suffix
    log.warning(f"{page.file.src_uri}: link {href!r} points at {target}, which is neither a page nor a file")
    return href


def _solution_cell_ids(repo: Path, stem: str) -> list[str]:
    cells = json.loads((repo / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    return [c["id"] for c in cells if "solution" in c.get("metadata", {}).get("tags", []) and "id" in c]


def _notebook_page(html: str, page, files, repo: Path) -> str:
    """Rewrite a rendered notebook: links to site pages, figures into files, solutions folded in <details>."""
    from bs4 import BeautifulSoup

    stem = Path(page.file.src_uri).stem
    html = HREF.sub(lambda m: f'href="{_rewrite_notebook_link(m.group("href"), page, files, repo)}"', html)
    soup = BeautifulSoup(html, "html.parser")
    for n, img in enumerate(soup.find_all("img", src=re.compile(r"^data:image/png;base64,"))):
        dest = f"figures/notebooks/{stem}-{n + 1:02d}.png"
        _EXTRA_BYTES[dest] = base64.b64decode(img["src"].split(",", 1)[1])
        img["src"] = get_relative_url(dest, page.url)
        img["alt"] = f"Figure {n + 1} of notebook {stem}"
    for cell_id in _solution_cell_ids(repo, stem):
        cell = soup.find(id=f"cell-id={cell_id}")
        if cell is None:
            log.warning(f"notebook {stem}: solution cell {cell_id} not found in the rendered page")
            continue
        outer = cell.parent if "jp-Cell" in (cell.parent.get("class") or []) else cell
        details = soup.new_tag("details", attrs={"class": "minikv-solution"})
        summary = soup.new_tag("summary")
        summary.string = "Solution (click to unfold)"
        outer.wrap(details)
        details.insert(0, summary)
    return str(soup)


def _figures_open_full_size(html: str) -> str:
    """Every content figure becomes a link to its PNG, so a click opens it at full size."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for img in soup.find_all("img"):
        src = img.get("src", "")
        if not src.endswith(".png") or img.find_parent("a") is not None:
            continue
        link = soup.new_tag("a", attrs={"href": src, "class": "minikv-figure", "title": "Open at full size"})
        img.wrap(link)
    return str(soup)


SOLUTION_CLASS = "minikv-solution"


def _solutions_out_of_search(html: str) -> str:
    """Every folded solution gets `data-search-exclude`, which mkdocs-material's search plugin skips (with all it
    holds) when it builds the index: an answer must not turn up as a search result before its exercise."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for details in soup.find_all("details", class_=SOLUTION_CLASS):
        details["data-search-exclude"] = ""
    return str(soup)


def on_page_content(html, page, config, files):
    """Notebook pages: links back to the docs pages that explain them, links rewritten for the site, figures
    as files, solutions folded. Every page: figures open at full size on click, folded solutions left out of the
    search index."""
    repo = _repo(config)
    stem = Path(page.file.src_uri).stem
    if page.file.src_uri.startswith("notebooks/") and stem in NOTEBOOK_PAGES:
        links = []
        for title, path in NOTEBOOK_PAGES[stem]:
            target = files.get_file_from_path(path)
            if target is None:
                log.warning(f"notebook {stem}: back link to missing docs page {path}")
                continue
            links.append(f'<a href="{get_relative_url(target.url, page.url)}">{title}</a>')
        note = ('<div class="admonition info minikv-backlinks"><p class="admonition-title">Explained in the docs</p>'
                f"<p>{' · '.join(links)}</p></div>")
        html = note + _notebook_page(html, page, files, repo)
    return _solutions_out_of_search(_figures_open_full_size(html))


def on_post_build(config):
    site = Path(config.site_dir)
    for dest, source in sorted(_EXTRA_FILES.items()):
        (site / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, site / dest)
    for dest, data in sorted(_EXTRA_BYTES.items()):
        (site / dest).parent.mkdir(parents=True, exist_ok=True)
        (site / dest).write_bytes(data)


# ---- figures --------------------------------------------------------------------------------------------------

# name -> (notebook stem, marker): the first figure output of the first code cell whose source contains the marker.
NOTEBOOK_FIGURES = {
    "paged-fragmentation": ("01_paged_kv_cache", "viz.fragmentation_plot("),
    "paged-slot-mapping": ("01_paged_kv_cache", "viz.slot_mapping_diagram(torch.tensor(slots), BLOCK_SIZE"),
    "paged-prefix-caching": ("01_paged_kv_cache", "Prefix caching: B reuses"),
    "formats-quant-error": ("02_quantized_kv_cache", "viz.quant_error_plot(errors[\"K\"]"),
    "scale-wipe-timeline": ("03_kv_sharing_scale_wipe", "viz_scale_wipe.timeline_figure("),
    "scale-wipe-wiped-reads": ("03_kv_sharing_scale_wipe", "viz_scale_wipe.wiped_reads_figure("),
    "scale-wipe-heatmap": ("03_kv_sharing_scale_wipe", "viz.scale_heatmap("),
    "scale-wipe-causal-chain": ("03_kv_sharing_scale_wipe", "viz_scale_wipe.causal_chain_figure("),
    "scale-wipe-byte-map": ("03_kv_sharing_scale_wipe", "viz_scale_wipe.storage_byte_map("),
    "scale-wipe-requests": ("03_kv_sharing_scale_wipe", 'title="Buggy engine"'),
    "scale-wipe-prefix-caching": ("03_kv_sharing_scale_wipe", 'title="Buggy, prefix caching"'),
    "cross-byte-map": ("04_cross_attention_stride_doubling", "vcs.stride_byte_map("),
    "cross-fp8-row": ("04_cross_attention_stride_doubling", "vcs.fp8_row_as_16bit("),
    "cross-output-scatter": ("04_cross_attention_stride_doubling", "vcs.output_scatter("),
    "cross-timeline": ("04_cross_attention_stride_doubling", "viz_cross_stride.cross_timeline_figure("),
    "cross-causal-chain": ("04_cross_attention_stride_doubling", "viz_cross_stride.cross_causal_chain_figure("),
}


def notebook_figure(repo: Path, stem: str, marker: str) -> bytes | None:
    """The PNG bytes of the first figure recorded by the first code cell of `stem` containing `marker`."""
    path = repo / "notebooks" / f"{stem}.ipynb"
    if not path.exists():
        return None
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code" or marker not in "".join(cell["source"]):
            continue
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                return base64.b64decode("".join(png) if isinstance(png, list) else png)
    return None


def viz_dpi() -> int:
    from minikv.viz import DPI
    return DPI


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=viz_dpi(), metadata={"Software": None})   # no version stamp: stable bytes
    return buffer.getvalue()


def _viz_figures() -> dict[str, bytes]:
    """The figures drawn at build time from the code itself (layouts and model configs, no engine run)."""
    import matplotlib
    matplotlib.use("Agg")
    import torch

    from minikv import viz
    from minikv.cache.layout import KVLayout
    from minikv.models.registry import model_config

    def layout(fmt: str, heads: int = 2, head_size: int = 32) -> KVLayout:
        return KVLayout(fmt, torch.float16, heads, head_size, 16)

    gemma4 = model_config("tiny-gemma4")      # the KV-sharing model (docs/concepts/kv-sharing.md)
    t5 = model_config("tiny-t5")              # the encoder-decoder (docs/concepts/cross-attention.md)
    figures = {
        "formats-int8-row": viz.row_layout_diagram(layout("int8_per_token_head", gemma4.num_kv_heads,
                                                          gemma4.head_size),
                                                   title="int8_per_token_head: codes, then an inline fp32 scale"),
        "sharing-layers": viz.layer_pool_diagram({i: gemma4.kv_owner(i) for i in range(gemma4.num_layers)},
                                                 gemma4.layer_types,
                                                 title="tiny-gemma4: the pool each layer reads and writes"),
        "cross-fp8-block": viz.row_layout_diagram(layout("fp8", t5.num_kv_heads, t5.head_size),
                                                  title="The fp8 cross pool as allocated: 1 byte per element"),
        "cross-16bit-block": viz.row_layout_diagram(layout("auto", t5.num_kv_heads, t5.head_size),
                                                    title="The same pool as a 16-bit reader addresses it"),
    }
    return {name: _png(fig) for name, fig in figures.items()}


def figures(repo: Path) -> dict[str, bytes]:
    """{figure name: PNG bytes} of every figure the docs embed; a missing notebook figure is a build warning."""
    out = _viz_figures()
    for name, (stem, marker) in NOTEBOOK_FIGURES.items():
        png = notebook_figure(repo, stem, marker)
        if png is None:
            log.warning(f"docs figure {name!r}: notebooks/{stem}.ipynb has no recorded figure in a cell containing "
                        f"{marker!r} (update NOTEBOOK_FIGURES in tools/docs_hooks.py)")
            continue
        out[name] = png
    return out
