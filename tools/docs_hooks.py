"""MkDocs hook (see mkdocs.yml): the parts of the site that follow the code instead of being written by hand.

* Notebooks: each of the five notebooks is added to the "Notebooks" section *if its .ipynb exists*, read from
  notebooks/ in place (mkdocs-jupyter renders it with its recorded outputs). A missing notebook is left out, so
  `mkdocs build --strict` passes while the notebooks are still being written.
* API reference: one generated page per package (minikv, minikv.cache, ..., minikv.kernels), listing every module
  found on disk with a mkdocstrings `:::` block, so a new module shows up without editing the docs.
"""
from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

NOTEBOOKS = [
    ("01_paged_kv_cache", "1. Paged KV cache"),
    ("02_quantized_kv_cache", "2. Quantized KV cache"),
    ("03_kv_sharing_scale_wipe", "3. KV sharing and the scale wipe"),
    ("04_cross_attention_stride_doubling", "4. Cross-attention stride doubling"),
    ("05_gpu_performance", "5. GPU performance"),
]
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
    return files
