"""The backend hunt (`minikv hunt --backend NAME`, minikv.hunt.hunt_backend): clean adapters hunt clean, each
planted defect is found within 60 s and shrunk to a program that, run as printed, exits 1 showing it, families a
backend cannot run are skipped with its reason, and the tolerance is neither blind nor a false alarm.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from minikv.attention.protocol import Adapter, Features
from minikv.hunt.backend_hunt import hunt_backend, warm_up
from minikv.hunt.families import FAMILIES
from minikv.hunt.kernel_case import KernelCase, check
from minikv.hunt.plants import PLANTS, planted
from minikv.hunt.tolerance import attention_bound

# where each plant can show (the family that finds it first on CPU, seed 0)
PLANT_FAMILIES = {"stride-twice": "block-tables", "scale-ignored": "fp8-scales", "full-last-page": "block-tables",
                  "window-off-by-one": "sliding-window"}


def test_sdpa_hunts_clean_over_every_family():
    report = hunt_backend("sdpa", budget_s=None, max_scenarios=160)
    assert not report.found, report.text()
    assert [f.outcome for f in report.families] == ["pass"] * len(FAMILIES)
    assert all(f.scenarios >= 8 for f in report.families), report.text()


def test_flexattention_hunts_clean_over_every_family():
    report = hunt_backend("flexattention", budget_s=None, max_scenarios=16)
    assert not report.found, report.text()
    assert {f.outcome for f in report.families} == {"pass"} and report.scenarios_run == 16


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_minikvs_own_backends_hunt_clean_at_kernel_level(name):
    """minikv's kernels and references are AttentionBackends too: the same families, the same oracles."""
    report = hunt_backend(name, budget_s=None, max_scenarios=24)
    assert not report.found, report.text()
    assert report.recipe == f"import minikv.attention.backend minikv.attention.backend.get_ops({name!r})"


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["sdpa", "flexattention"])
def test_clean_adapters_hunt_clean_for_a_minute(adapter):
    report = hunt_backend(adapter, budget_s=60)
    assert not report.found, report.text()


@pytest.mark.parametrize("adapter", ["sdpa", "flexattention"])
@pytest.mark.parametrize("plant", PLANTS)
def test_each_plant_is_found_within_a_minute(adapter, plant):
    report = hunt_backend(planted(adapter, plant), budget_s=60, stop_at_first=True)
    finding = report.first_finding()
    assert finding is not None, report.text()
    assert finding.seconds_to_find < 60
    assert finding.name == PLANT_FAMILIES[plant]
    # the shrunk case still fails, and the clean adapter passes it
    assert check(planted(adapter, plant), finding.case) and not check(__import__(
        "minikv.attention.backends", fromlist=["get"]).get(adapter), finding.case)


@pytest.mark.parametrize("plant", PLANTS)
def test_the_printed_program_runs_and_exits_1(plant, tmp_path):
    finding = hunt_backend(planted("sdpa", plant), budget_s=60, stop_at_first=True).first_finding()
    script = tmp_path / "repro.py"
    script.write_text(finding.program + "\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"invariant {finding.violations[0].invariant}:" in done.stdout
    assert "expected" in done.stdout or finding.violations[0].invariant == "runs"
    assert f"planted('sdpa', {plant!r})" in finding.program


class NoWindowNoBytes(Adapter):
    """A backend without sliding windows or 1-byte formats (a stand-in for a kernel that lacks them)."""

    name = "narrow"
    features = Features(formats=("auto",), sliding_window=False, head_sizes=(64, 128),
                        notes={"sliding_window": "this kernel has no window", "formats": "16-bit only"})

    def decode_step(self, s):
        from minikv.attention.backends.sdpa import Backend
        return Backend().decode_step(s)

    def context_step(self, s):
        from minikv.attention.backends.sdpa import Backend
        return Backend().context_step(s)


def test_families_a_backend_lacks_are_skipped_with_its_reason():
    report = hunt_backend(NoWindowNoBytes(), budget_s=None, max_scenarios=40)
    by_name = {f.name: f for f in report.families}
    assert by_name["sliding-window"].outcome == "skipped" and by_name["sliding-window"].why == "this kernel has no window"
    assert by_name["fp8-scales"].outcome == "skipped" and by_name["fp8-scales"].why == "16-bit only"
    assert by_name["head-sizes"].outcome == "pass" and "not 256, 512" in by_name["head-sizes"].why
    assert "sliding-window  skipped (this kernel has no window)" in report.text()
    assert not report.found


def test_the_same_seed_tries_the_same_cases():
    one = hunt_backend("sdpa", budget_s=None, max_scenarios=30, seed=3).to_dict()
    two = hunt_backend("sdpa", budget_s=None, max_scenarios=30, seed=3).to_dict()
    assert [f["scenarios"] for f in one["families"]] == [f["scenarios"] for f in two["families"]]


def test_tolerance_is_met_by_float16_rounding_and_missed_by_one_key():
    """The derived bound holds for attention computed in float16 (D = 512, 64 keys), and a change of one key's
    weight (what a window off by one does) exceeds it in float32."""
    torch.manual_seed(0)
    q = torch.randn(4, 8, 512)
    k, v = torch.randn(64, 2, 512, dtype=torch.float64), torch.randn(64, 2, 512, dtype=torch.float64)
    visible = torch.ones(4, 64, dtype=torch.bool)
    o, tol = attention_bound(q.half(), k, v, visible, 512 ** -0.5, torch.float16)
    kh, vh = k.half().repeat_interleave(4, 1), v.half().repeat_interleave(4, 1)
    s = torch.einsum("qhd,khd->hqk", q.half().float(), kh.float()).half() * 512 ** -0.5
    half = torch.einsum("hqk,khd->qhd", torch.softmax(s.float(), -1).half().float(), vh.float()).half()
    assert bool(((half.double() - o).abs() <= tol).all())
    o32, tol32 = attention_bound(q, k, v, visible, 512 ** -0.5, torch.float32)
    less, _ = attention_bound(q, k[1:], v[1:], visible[:, 1:], 512 ** -0.5, torch.float32)
    assert bool(((less - o32).abs() > tol32).any())


def test_cli_hunts_a_backend_and_writes_results(tmp_path, capsys):
    import json

    from minikv.cli import main
    out = tmp_path / "r.json"
    assert main(["hunt", "--backend", "sdpa", "--max-scenarios", "12", "--family", "gqa", "--family", "cross-pools",
                 "--results", str(out)]) == 0
    text = capsys.readouterr().out
    assert "backend sdpa (cpu): 12 scenarios" in text and "cross-pools     pass" in text
    data = json.loads(out.read_text())
    assert data["command"].startswith("minikv hunt --backend sdpa") and data["outcome"] == "clean"
    with pytest.raises(SystemExit) as info:
        main(["hunt", "--backend", "sdpa", "--model", "tiny-t5", "--budget", "1"])
    assert info.value.code == 2 and "--model goes with the engine hunt" in capsys.readouterr().err


def test_kernel_case_prints_as_python():
    case = KernelCase("gqa", step="context", group=4, seq_lens=(5, 16), q_lens=(2, 3))
    assert eval(case.code(), {"KernelCase": KernelCase}) == case


# ---- FlashInfer, on CUDA (`pytest -m gpu`): its kernels are JIT-compiled on first use, so a module fixture
# compiles every variant the hunt calls (`warm_up`, head size 128) before any hunt is timed.
@pytest.fixture(scope="module")
def flashinfer_128():
    import dataclasses

    from minikv.attention import backends
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        backend = backends.get("flashinfer")
    except backends.MissingBackendError as e:
        pytest.skip(str(e))
    backend.features = dataclasses.replace(backend.features, head_sizes=(128,))
    assert warm_up(backend) == []
    return backend


@pytest.mark.gpu
def test_flashinfer_hunts_clean(flashinfer_128):
    report = hunt_backend(flashinfer_128, budget_s=60)
    assert not report.found, report.text()
    assert {f.name for f in report.families if f.outcome == "pass"} == set(FAMILIES)


@pytest.mark.gpu
@pytest.mark.parametrize("plant", PLANTS)
def test_flashinfer_plants_are_found_within_a_minute(flashinfer_128, plant):
    from minikv.hunt.plants import Planted
    report = hunt_backend(Planted(flashinfer_128, plant, "flashinfer"), budget_s=60, stop_at_first=True)
    finding = report.first_finding()
    assert finding is not None, report.text()
    assert finding.seconds_to_find < 60
    print(f"flashinfer {plant}: found in family {finding.name} after {finding.seconds_to_find:.1f} s "
          f"(scenario {finding.scenario_number})")


@pytest.mark.gpu
def test_minikvs_compiled_kernels_hunt_clean_at_kernel_level_on_cuda():
    """The same families against minikv's Triton kernels compiled on CUDA (row window, split-K, pipelined 1-byte
    reads: the launch configurations the interpreter does not take)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    report = hunt_backend("triton", device="cuda", budget_s=60)
    assert not report.found, report.text()
