"""JupyterLab in a real browser: open a notebook, Run All Cells, and check what a person would see.

A JupyterLab server is started on 127.0.0.1 (free port, token, temporary runtime/settings/workspace folders) and
Debian's Chromium is driven headless through Playwright. The notebook is copied into a temporary folder first,
so the recorded outputs in notebooks/ are never touched. After the run the notebook is saved from the browser and
the saved file is read back: no cell may hold an error output, every code cell must have run, and figures must be
rendered as images. A screenshot is written under build/screenshots/.

Two tests: notebook 01 (skipped until it exists) and a tiny smoke notebook made on the fly, so that the browser
path runs in CI from the start. Needs /usr/bin/chromium (`apt-get install -y chromium`) and the `playwright` pip
package (its bundled driver only; no browser download).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK_01 = REPO / "notebooks" / "01_paged_kv_cache.ipynb"
SCREENSHOTS = REPO / "build" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
RUN_TIMEOUT_S = float(os.environ.get("MINIKV_BROWSER_TIMEOUT", "600"))

# Lab settings for a deterministic run: every cell attached to the DOM (no windowing, so all prompts and outputs
# can be read), no autosave, no news/update requests.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}

# True once Run All has finished: nothing queued or running, the kernel idle, and at least one cell numbered
# (outputs are cleared first, so numbers come from this run only).
RUN_FINISHED_JS = """() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
      .map(e => e.textContent.trim());
  if (prompts.length === 0 || prompts.some(p => p.includes('*'))) return false;
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  if (indicator && indicator.getAttribute('data-status') !== 'idle') return false;
  return prompts.some(p => /\\d/.test(p));
}"""


KERNEL_IDLE_JS = """() => [...document.querySelectorAll('.jp-StatusBar-Item')]
    .some(e => /\\|\\s*Idle\\s*$/.test(e.textContent.trim()))"""
RUN_STARTED_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .some(e => /[*0-9]/.test(e.textContent))"""
PROMPTS_JS = "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent)"


def _require_browser():
    if not CHROMIUM.exists():
        pytest.skip("no browser: /usr/bin/chromium is missing (install Debian's chromium: "
                    "apt-get install -y chromium); the JupyterLab browser test needs it")
    pytest.importorskip("playwright.sync_api", reason="the `playwright` pip package is not installed")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status


@contextmanager
def jupyter_lab(root: Path, scratch: Path):
    """Start JupyterLab serving `root`; yield (base_url, token); shut it (and its kernels) down afterwards."""
    port, token = _free_port(), os.urandom(16).hex()
    for rel, values in LAB_SETTINGS.items():
        path = scratch / "settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    for name in ("runtime", "config", "workspaces"):
        (scratch / name).mkdir(exist_ok=True)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(scratch / "runtime"), JUPYTER_CONFIG_DIR=str(scratch / "config"),
               TQDM_DISABLE="1")
    env.pop("MPLBACKEND", None)       # let the kernel use the inline backend, as a person's JupyterLab does
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
               f"--port={port}", "--port-retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={scratch / 'settings'}",
               f"--LabApp.workspaces_dir={scratch / 'workspaces'}", "--LabApp.extension_manager=readonly"]
    log_path = scratch / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if _get(f"{base}/api/status?token={token}") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within 90 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        try:
            _get(f"{base}/api/shutdown?token={token}", method="POST")   # also shuts down its kernels
            server.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def run_notebook_in_lab(notebook: Path, tmp_path: Path, screenshot_name: str) -> dict:
    """Open a copy of `notebook` in JupyterLab, clear outputs, Run All Cells, save; report what was seen."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab-root"
    root.mkdir()
    shutil.copy(notebook, root / notebook.name)
    saved = root / notebook.name
    started = time.monotonic()
    with jupyter_lab(root, tmp_path) as (base, token), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=90_000)
            # The status bar says "| Idle" once the page's kernel connection is up; earlier, Run All can be lost.
            page.wait_for_function(KERNEL_IDLE_JS, timeout=90_000, polling=250)
            _menu(page, "Edit", "Clear Outputs of All Cells")
            for attempt in range(3):
                _menu(page, "Run", "Run All Cells")
                try:
                    page.wait_for_function(RUN_STARTED_JS, timeout=20_000, polling=100)
                    break
                except PlaywrightTimeoutError:
                    if attempt == 2:
                        raise
            try:
                page.wait_for_function(RUN_FINISHED_JS, timeout=RUN_TIMEOUT_S * 1000, polling=500)
            except PlaywrightTimeoutError:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"{screenshot_name}-timeout.png"))
                prompts = page.evaluate(PROMPTS_JS)
                log = (tmp_path / "jupyterlab.log").read_text()[-3000:]
                pytest.fail(f"Run All did not finish within {RUN_TIMEOUT_S:.0f} s; prompts {prompts}; screenshot "
                            f"{screenshot_name}-timeout.png; server log:\n{log}")
            page.wait_for_timeout(500)           # let the last outputs render
            report = page.evaluate("""() => ({
                prompts: [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
                    .map(e => e.textContent.trim()),
                images: document.querySelectorAll('.jp-OutputArea-output img').length,
                tracebacks: [...document.querySelectorAll('.jp-OutputArea-output')]
                    .map(e => e.textContent).filter(t => t.includes('Traceback (most recent call last)'))
                    .map(t => t.slice(0, 2000)),
            })""")
            first_image = page.locator(".jp-OutputArea-output img").first
            if report["images"]:
                first_image.scroll_into_view_if_needed()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"{screenshot_name}.png"))

            before = saved.stat().st_mtime_ns
            _menu(page, "File", "Save Notebook")
            deadline = time.monotonic() + 30
            while saved.stat().st_mtime_ns == before and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            browser.close()
    cells = json.loads(saved.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    report["saved_errors"] = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    report["saved_counts"] = [c["execution_count"] for c in code]
    report["seconds"] = time.monotonic() - started
    return report


def _assert_clean_run(report: dict, min_images: int) -> None:
    assert not report["saved_errors"], "cells raised: " + "; ".join(
        f"{e['ename']}: {e['evalue']}" for e in report["saved_errors"])
    assert not report["tracebacks"], "a traceback is shown:\n" + report["tracebacks"][0]
    assert all(isinstance(n, int) for n in report["saved_counts"]), (
        f"not every code cell ran: execution counts {report['saved_counts']}")
    assert report["images"] >= min_images, f"{report['images']} figure(s) rendered, expected >= {min_images}"


def _make_smoke_notebook(path: Path) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                       "language": "python"}
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Smoke test\nA minikv figure, rendered by the browser."),
        nbformat.v4.new_code_cell("from minikv import viz\nprint('minikv viz imported')"),
        nbformat.v4.new_code_cell("viz.request_grid([True, True, False, False, False, False], max_num_seqs=2)"),
    ]
    nbformat.write(notebook, path)


def test_smoke_notebook_runs_in_jupyterlab(tmp_path):
    _require_browser()
    notebook = tmp_path / "smoke.ipynb"
    _make_smoke_notebook(notebook)
    work = tmp_path / "run"
    work.mkdir()
    report = run_notebook_in_lab(notebook, work, "smoke")
    _assert_clean_run(report, min_images=1)
    assert report["prompts"] == ["[1]:", "[2]:"], report["prompts"]


def test_smoke_driver_sees_errors(tmp_path):
    """The driver itself must notice a failing cell, or the real test could never fail."""
    _require_browser()
    notebook = tmp_path / "failing.ipynb"
    _make_smoke_notebook(notebook)
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('deliberate failure')"))
    nbformat.write(nb, notebook)
    work = tmp_path / "run"
    work.mkdir()
    report = run_notebook_in_lab(notebook, work, "smoke-failing")
    with pytest.raises(AssertionError, match="deliberate failure"):
        _assert_clean_run(report, min_images=0)


def test_notebook_01_runs_in_jupyterlab(tmp_path):
    _require_browser()
    if not NOTEBOOK_01.exists():
        pytest.skip(f"{NOTEBOOK_01.relative_to(REPO)} does not exist yet")
    report = run_notebook_in_lab(NOTEBOOK_01, tmp_path, NOTEBOOK_01.stem)
    _assert_clean_run(report, min_images=1)
