"""The package as a user installs it: a regular wheel carries the top-level kernels/ folder as minikv.kernels, the
shipped weights and every subpackage, and imports from the wheel alone (not from this checkout)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_maps_kernels_and_imports_from_the_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    wheel = next((tmp_path / "dist").glob("minikv-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("minikv/kernels/__init__.py", "minikv/kernels/decode_attention.py", "minikv/repro/scale_wipe/__init__.py",
                   "minikv/bench/attention.py",
                   "minikv/models/weights/tiny-gemma4/model.safetensors",
                   "minikv/models/weights/tiny-gemma4/config.json",
                   "minikv/models/weights/tiny-gemma4/minikv_tokenizer.json",
                   "minikv/models/weights/tiny-t5/model.safetensors"):
        assert needed in names, needed
    assert not any(n.startswith("kernels/") for n in names)     # no top-level package called "kernels"
    assert not any(n.startswith("minikv/models/weights/") and n.count("/") == 3 and n.endswith(".safetensors")
                   for n in names)                             # only the two checkpoint directories ship weights

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # Drop the editable install's import hook so that only the unpacked wheel can provide minikv.
    probe = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in type(f).__module__.lower()\n"
        "                 and 'editable' not in getattr(f, '__name__', '').lower()]\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "import minikv, minikv.kernels\n"
        "from minikv.models import registry\n"
        "registry.load_model('tiny-gemma4'); registry.load_model('tiny-t5')\n"
        "print(minikv.__file__); print(minikv.kernels.__file__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.split()
    assert all(path.startswith(str(site)) for path in out), out
