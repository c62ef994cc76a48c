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
"""
from __future__ import annotations

import base64
import io
import json
import logging
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
    """Module names (without the package) of a package folder, __init__ first; private and __main__ skipped."""
    names = sorted(p.stem for p in package_dir.glob("*.py") if not p.stem.startswith("_"))
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
            options = ["    options:", "      members: false"] if module == "__init__" else []
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


def on_page_content(html, page, config, files):
    """Prepend links to the docs pages that explain a notebook to its rendered page."""
    stem = Path(page.file.src_uri).stem
    if not page.file.src_uri.startswith("notebooks/") or stem not in NOTEBOOK_PAGES:
        return html
    links = []
    for title, path in NOTEBOOK_PAGES[stem]:
        target = files.get_file_from_path(path)
        if target is None:
            log.warning(f"notebook {stem}: back link to missing docs page {path}")
            continue
        links.append(f'<a href="{get_relative_url(target.url, page.url)}">{title}</a>')
    note = ('<div class="admonition info minikv-backlinks"><p class="admonition-title">Explained in the docs</p>'
            f"<p>{' · '.join(links)}</p></div>")
    return note + html


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
    "scale-wipe-requests": ("03_kv_sharing_scale_wipe", 'title="Buggy engine"'),
    "scale-wipe-prefix-caching": ("03_kv_sharing_scale_wipe", 'title="Buggy, prefix caching"'),
    "cross-byte-map": ("04_cross_attention_stride_doubling", "vcs.stride_byte_map("),
    "cross-fp8-row": ("04_cross_attention_stride_doubling", "vcs.fp8_row_as_16bit("),
    "cross-output-scatter": ("04_cross_attention_stride_doubling", "vcs.output_scatter("),
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


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})   # no version stamp: stable bytes
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
    # One box per layer's pool: a KV-sharing layer points at its target's pool (the same tensor).
    owners = {f"layer {i}" + (f" (shares layer {gemma4.kv_owner(i)})" if gemma4.kv_owner(i) != i else ""):
              [gemma4.kv_owner(i)] for i in range(gemma4.num_layers)}
    num_pools = len({gemma4.kv_owner(i) for i in range(gemma4.num_layers)})
    figures = {
        "formats-int8-row": viz.row_layout_diagram(layout("int8_per_token_head", gemma4.num_kv_heads,
                                                          gemma4.head_size),
                                                   title="int8_per_token_head: codes, then an inline fp32 scale"),
        "sharing-layers": viz.block_table_diagram(owners, num_blocks=num_pools,
                                                  title="Layer → pool"),
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
