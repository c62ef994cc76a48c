"""Fixtures the Python blocks of README.md and docs/ name in their fence, as `{.python fixture:NAME}`: each skips a
block that needs what this machine may lack, saying what. pytest-markdown-docs runs the blocks (`make test`)."""
from __future__ import annotations

import os

import pytest


@pytest.fixture
def needs_cuda():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def needs_gemma4_e2b():
    """The block loads the directory its text names, /path/to/gemma-4-E2B-it."""
    if not os.path.isdir("/path/to/gemma-4-E2B-it"):
        pytest.skip("needs gemma-4-E2B-it downloaded (about 10 GB) into /path/to/gemma-4-E2B-it")
