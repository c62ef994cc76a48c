"""Every module and subpackage of minikv has a place in the layer contract that `lint-imports` checks
(pyproject.toml, `[tool.importlinter]`): a module left out of it would be free to import anything."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_top_level_module_is_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    placed = {name for layer in layers for name in re.split(r"\s*[|:]\s*", layer)}
    package = ROOT / "minikv"
    modules = {f"minikv.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"minikv.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(modules - placed) == [], "add these to a layer of the contract in pyproject.toml"
    assert sorted(placed - modules) == [], "the contract names modules that do not exist"
