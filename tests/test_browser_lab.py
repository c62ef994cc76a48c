"""JupyterLab in a real browser: open a notebook, Run All Cells, and check what a person would see.

One JupyterLab server per test module, on 127.0.0.1 (free port, token, temporary runtime/config/settings/workspace
folders), and Debian's Chromium driven headless through Playwright. Each notebook is copied into the server's
temporary root first, so the recorded outputs in notebooks/ are never touched. After Run All the notebook is saved
from the browser and the saved file is read back: no cell may hold an error output, every code cell must have run,
and figures must be rendered as images. A screenshot is written under build/screenshots/.

Tests: the CPU notebooks of the walkthrough that draw figures, 01, 03 and 04 (each skipped until it exists; found by
number, so a renamed notebook is still opened), and a tiny smoke notebook made on the fly (plus a failing variant
and one with a broken image, which the checks must catch), so that the browser path runs in CI from the start. The
checks are generic: no cell fails, every cell ran, at least one figure is shown and every image shown has loaded
(complete, naturalWidth > 0); nothing depends on which figures a notebook draws. Needs /usr/bin/chromium
(`apt-get install -y chromium`) and the `playwright` pip package (its bundled driver only; no browser download).

The built documentation site is opened in the same Chromium too (served over HTTP on 127.0.0.1): each concept and
defect page must show exactly one top-level heading and every image on it must have loaded (naturalWidth > 0).
And straight from disk (file://, the way an offline reader opens site/): the home page, both defect pages and a
rendered notebook, then every page they link to, each of which must open (no missing file) with every image
loaded; on the four, every figure must be shown at its own width or the column's (minikv.viz.SHOWN_WIDTH_PX),
never shrunk below it, which is the width its text sizes are checked at (tests/test_viz_legibility.py). Each
figure is saved as it is shown under build/screenshots/site-*.png. tests/test_docs_build.py checks the links from
the HTML, for machines without a browser.
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
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOKS = REPO / "notebooks"
# The walkthrough notebooks opened in the browser, by number (05 is recorded on a GPU: its first cells need CUDA):
# 01 in the default run (`make test`), 03 and 04 too in `make test-all` (marked slow: the browser path is the same).
BROWSER_NOTEBOOKS = ("01", pytest.param("03", marks=pytest.mark.slow), pytest.param("04", marks=pytest.mark.slow))
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

# Every query is scoped to the notebook panel on show.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PROMPTS = f"[...document.querySelectorAll('{PANEL} .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
# The status bar says "| Idle" once the page's kernel connection is up; a Run All sent earlier can be lost.
KERNEL_IDLE_JS = """() => [...document.querySelectorAll('.jp-StatusBar-Item')]
    .some(e => /\\|\\s*Idle\\s*$/.test(e.textContent.trim()))"""
RUN_STARTED_JS = f"() => {PROMPTS}.some(p => /[*0-9]/.test(p))"
# Run All has finished: nothing queued or running, the kernel idle, and at least one cell numbered (outputs are
# cleared first, so numbers come from this run; after an error the remaining cells go back to "[ ]").
RUN_FINISHED_JS = f"""() => {{
  const prompts = {PROMPTS};
  if (prompts.length === 0 || prompts.some(p => p.includes('*'))) return false;
  const indicator = document.querySelector('{PANEL} .jp-Notebook-ExecutionIndicator');
  if (indicator && indicator.getAttribute('data-status') !== 'idle') return false;
  return prompts.some(p => /[0-9]/.test(p));
}}"""
IMAGES_SETTLED_JS = f"() => [...document.querySelectorAll('{PANEL} .jp-OutputArea-output img')].every(i => i.complete)"
REPORT_JS = f"""() => ({{
  prompts: {PROMPTS},
  images: document.querySelectorAll('{PANEL} .jp-OutputArea-output img').length,
  image_states: [...document.querySelectorAll('{PANEL} .jp-OutputArea-output img')]
      .map(i => ({{complete: i.complete, width: i.naturalWidth, alt: (i.getAttribute('src') || '').slice(0, 40)}})),
  tracebacks: [...document.querySelectorAll('{PANEL} .jp-OutputArea-output')].map(e => e.textContent)
      .filter(t => t.includes('Traceback (most recent call last)')).map(t => t.slice(0, 2000)),
}})"""


# One Playwright driver and one Chromium for the whole module, shared by JupyterLab and the docs site: the sync API
# runs one driver per thread, so a second `sync_playwright().start()` while the first is alive fails.
_CHROMIUM = {"playwright": None, "browser": None, "users": 0}


def _acquire_chromium():
    if _CHROMIUM["browser"] is None:
        from playwright.sync_api import sync_playwright

        _CHROMIUM["playwright"] = sync_playwright().start()
        _CHROMIUM["browser"] = _CHROMIUM["playwright"].chromium.launch(executable_path=str(CHROMIUM),
                                                                      args=CHROMIUM_ARGS)
    _CHROMIUM["users"] += 1
    return _CHROMIUM["browser"]


def _release_chromium() -> None:
    _CHROMIUM["users"] -= 1
    if _CHROMIUM["users"] == 0:
        _CHROMIUM["browser"].close()
        _CHROMIUM["playwright"].stop()
        _CHROMIUM["browser"] = _CHROMIUM["playwright"] = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
        body = response.read()
        return response.status, (json.loads(body) if body else None)


class Lab:
    """A running JupyterLab server (serving `root`) and a headless Chromium, shared by the tests of this module."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.root = scratch / "lab-root"
        self.root.mkdir()
        self.port, self.token = _free_port(), os.urandom(16).hex()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "jupyterlab.log"
        self.server = None
        self.browser = None

    def api(self, path: str, method: str = "GET"):
        return _request(f"{self.base}{path}?token={self.token}", method)

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def start(self) -> None:
        for rel, values in LAB_SETTINGS.items():
            path = self.scratch / "settings" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        for name in ("runtime", "config", "workspaces"):
            (self.scratch / name).mkdir(exist_ok=True)
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(self.scratch / "runtime"),
                   JUPYTER_CONFIG_DIR=str(self.scratch / "config"), TQDM_DISABLE="1")
        env.pop("MPLBACKEND", None)       # let the kernel use the inline backend, as a person's JupyterLab does
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                   f"--port={self.port}", "--port-retries=0", f"--IdentityProvider.token={self.token}",
                   f"--ServerApp.root_dir={self.root}", f"--LabApp.user_settings_dir={self.scratch / 'settings'}",
                   f"--LabApp.workspaces_dir={self.scratch / 'workspaces'}", "--LabApp.extension_manager=readonly"]
        with open(self.log_path, "w") as log:
            self.server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + 90
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.server.returncode}:\n{self.log_tail()}")
            try:
                if self.api("/api/status")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer within 90 s:\n{self.log_tail()}")
            time.sleep(0.5)
        self.browser = _acquire_chromium()

    def stop(self) -> None:
        if self.browser is not None:
            _release_chromium()
        if self.server is None:
            return
        try:
            self.api("/api/shutdown", method="POST")     # also shuts down its kernels
            self.server.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def shut_down_kernel_of(self, name: str) -> None:
        _, sessions = self.api("/api/sessions")
        for session in sessions or []:
            if session.get("path") == name:
                self.api(f"/api/sessions/{session['id']}", method="DELETE")


def _require_browser(test: str) -> None:
    """Skip, saying what to install, unless Debian's Chromium and the playwright driver are both here."""
    if not CHROMIUM.exists():
        pytest.skip("no browser: /usr/bin/chromium is missing (install Debian's chromium: "
                    f"apt-get install -y chromium); the {test} needs it")
    pytest.importorskip("playwright.sync_api", reason="the `playwright` pip package is not installed")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _require_browser("JupyterLab browser test")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
    session = Lab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        session.start()
        yield session
    finally:
        session.stop()


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def run_notebook_in_lab(lab: Lab, notebook: Path, screenshot_name: str) -> dict:
    """Open a copy of `notebook` in JupyterLab, clear outputs, Run All Cells, save; report what was seen."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    saved = lab.root / notebook.name
    shutil.copy(notebook, saved)
    started = time.monotonic()
    page = lab.browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab.base}/lab/tree/{notebook.name}?token={lab.token}&reset")   # reset: no other tabs
        page.wait_for_selector(f"{PANEL} .jp-CodeCell", timeout=90_000)
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
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        try:
            page.wait_for_function(RUN_FINISHED_JS, timeout=RUN_TIMEOUT_S * 1000, polling=500)
        except PlaywrightTimeoutError:
            page.screenshot(path=str(SCREENSHOTS / f"{screenshot_name}-timeout.png"))
            pytest.fail(f"Run All did not finish within {RUN_TIMEOUT_S:.0f} s; prompts "
                        f"{page.evaluate(f'() => {PROMPTS}')}; screenshot {screenshot_name}-timeout.png; "
                        f"server log:\n{lab.log_tail()}")
        page.wait_for_timeout(500)           # let the last outputs render
        try:                                 # every figure decoded (or failed) before it is judged
            page.wait_for_function(IMAGES_SETTLED_JS, timeout=30_000, polling=250)
        except PlaywrightTimeoutError:
            pass                             # reported below as images that did not load
        report = page.evaluate(REPORT_JS)
        if report["images"]:
            page.locator(f"{PANEL} .jp-OutputArea-output img").first.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"{screenshot_name}.png"))

        before = saved.stat().st_mtime_ns
        _menu(page, "File", "Save Notebook")
        deadline = time.monotonic() + 30
        while saved.stat().st_mtime_ns == before and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        page.close()
        lab.shut_down_kernel_of(notebook.name)
    code = [c for c in json.loads(saved.read_text())["cells"] if c["cell_type"] == "code"]
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
    broken = [i for i, s in enumerate(report["image_states"]) if not s["complete"] or s["width"] == 0]
    assert not broken, (f"{len(broken)} of {report['images']} image(s) did not load (naturalWidth 0): numbers "
                        f"{broken}, e.g. {report['image_states'][broken[0]]}")


def _smoke_notebook(path: Path, failing: bool = False, broken_image: bool = False) -> Path:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                       "language": "python"}
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Smoke test\nA minikv figure, rendered by the browser."),
        nbformat.v4.new_code_cell("from minikv import viz\nprint('minikv viz imported')"),
        nbformat.v4.new_code_cell("viz.request_grid([True, True, False, False, False, False], max_num_seqs=2)"),
    ]
    if failing:
        notebook.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('deliberate failure')"))
    if broken_image:   # a PNG output whose bytes are not an image: shown as <img>, but it never loads
        cell = nbformat.v4.new_code_cell("from IPython.display import Image, display\n"
                                         "display(Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + bytes(64), format='png'))")
        notebook.cells.append(cell)
    nbformat.write(notebook, path)
    return path


def test_smoke_notebook_runs_in_jupyterlab(lab, tmp_path):
    report = run_notebook_in_lab(lab, _smoke_notebook(tmp_path / "smoke.ipynb"), "smoke")
    _assert_clean_run(report, min_images=1)
    assert report["prompts"] == ["[1]:", "[2]:"], report["prompts"]


def test_smoke_driver_sees_errors(lab, tmp_path):
    """The driver itself must notice a failing cell, or the real test could never fail."""
    report = run_notebook_in_lab(lab, _smoke_notebook(tmp_path / "failing.ipynb", failing=True), "smoke-failing")
    with pytest.raises(AssertionError, match="deliberate failure"):
        _assert_clean_run(report, min_images=0)
    assert report["prompts"] == ["[1]:", "[2]:", "[ ]:"], report["prompts"]


def test_smoke_driver_sees_a_broken_image(lab, tmp_path):
    """An image element that never loads must fail the figure check, or a broken figure would pass unseen."""
    report = run_notebook_in_lab(lab, _smoke_notebook(tmp_path / "broken.ipynb", broken_image=True), "smoke-broken")
    assert report["images"] == 2, report["image_states"]
    with pytest.raises(AssertionError, match="did not load"):
        _assert_clean_run(report, min_images=1)


@pytest.mark.parametrize("number", BROWSER_NOTEBOOKS)
def test_walkthrough_notebook_runs_in_jupyterlab(request, number):
    """Run All in JupyterLab: no cell fails, and every figure the notebook draws is rendered and loaded."""
    found = sorted(NOTEBOOKS.glob(f"{number}_*.ipynb"))
    if not found:
        pytest.skip(f"no notebooks/{number}_*.ipynb yet")
    notebook = found[0]
    report = run_notebook_in_lab(request.getfixturevalue("lab"), notebook, notebook.stem)
    _assert_clean_run(report, min_images=1)


# ---- the documentation site in Chromium -------------------------------------------------------------------------

SITE_REPORT_JS = """() => ({
  h1: [...document.querySelectorAll('h1')].map(e => e.textContent.trim()),
  images: [...document.querySelectorAll('article img')].map(e => ({src: e.getAttribute('src'), complete: e.complete,
                                                                   width: e.naturalWidth})),
})"""


def _docs_build_module():
    """tests/test_docs_build.py as pytest imported it (so its one build of the site is shared), or loaded here."""
    import importlib.util

    module = sys.modules.get("test_docs_build")
    if module is None:
        spec = importlib.util.spec_from_file_location("test_docs_build", REPO / "tests" / "test_docs_build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["test_docs_build"] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site_browser(tmp_path_factory):
    """(base URL of the built site served on 127.0.0.1, a headless Chromium)."""
    _require_browser("docs browser test")
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    site = _docs_build_module().build_site(tmp_path_factory)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        browser = _acquire_chromium()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", browser
        finally:
            _release_chromium()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("page", ["concepts/paged-kv-cache", "concepts/kv-cache-formats", "concepts/kv-sharing",
                                  "concepts/cross-attention", "defects/scale-wipe",
                                  "defects/cross-stride-fp8-context"])
def test_docs_page_renders_in_chromium(site_browser, page):
    base, browser = site_browser
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        response = tab.goto(f"{base}/{page}.html", wait_until="load")
        assert response is not None and response.ok, f"{page}: HTTP {response.status if response else None}"
        tab.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=30_000)
        report = tab.evaluate(SITE_REPORT_JS)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / f"docs-{page.replace('/', '-')}.png"), full_page=True)
    finally:
        tab.close()
    assert len(report["h1"]) == 1, f"{page}: {len(report['h1'])} top-level headings: {report['h1']}"
    assert report["images"], f"{page} shows no figure"
    broken = [i["src"] for i in report["images"] if not i["complete"] or i["width"] == 0]
    assert not broken, f"{page}: images that did not load: {broken}"


# ---- the site from disk: every link of the main pages, followed ------------------------------------------------

FROM_DISK_PAGES = ("index.html", "defects/scale-wipe.html", "defects/cross-stride-fp8-context.html",
                   "notebooks/03_kv_sharing_scale_wipe.html")
LINKS_JS = """() => [...document.querySelectorAll('a[href]')].map(a => a.href)
    .filter(h => h.startsWith('file:'))"""
IMAGES_JS = """() => [...document.querySelectorAll('img')].map(i => ({src: i.getAttribute('src'), complete: i.complete,
    natural: i.naturalWidth, shown: i.getBoundingClientRect().width}))"""


@pytest.fixture(scope="module")
def site_on_disk(tmp_path_factory):
    """(the built site's folder, a headless Chromium); the site is the one tests/test_docs_build.py built."""
    _require_browser("docs browser test")
    site = _docs_build_module().build_site(tmp_path_factory)
    browser = _acquire_chromium()
    try:
        yield site.resolve(), browser
    finally:
        _release_chromium()


def _open_from_disk(tab, url: str) -> list[dict]:
    """Open a file:// URL (a missing file raises: net::ERR_FILE_NOT_FOUND); the page's images once loaded."""
    tab.goto(url, wait_until="load")
    tab.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=30_000)
    return tab.evaluate(IMAGES_JS)


def test_site_opens_from_disk_and_every_link_of_its_main_pages_works(site_on_disk):
    from minikv.viz import SHOWN_WIDTH_PX

    site, browser = site_on_disk
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems, to_follow = [], {}
    try:
        for page in FROM_DISK_PAGES:
            url = (site / page).as_uri()
            images = _open_from_disk(tab, url)
            problems += [f"{page}: image {i['src']} did not load" for i in images if i["natural"] == 0]
            for image in images:
                expected = min(image["natural"], SHOWN_WIDTH_PX)
                if "figures/" in (image["src"] or "") and image["shown"] < expected - 1:
                    problems.append(f"{page}: {image['src']} shown {image['shown']:.0f} px wide, shrunk below "
                                    f"{expected} px (its text would be smaller than it was checked at)")
            for n, figure in enumerate(tab.locator("article img").all()):
                if "figures/" in (figure.get_attribute("src") or ""):
                    figure.screenshot(path=str(SCREENSHOTS / f"site-{page.replace('/', '-')[:-5]}-fig{n + 1}.png"))
            tab.screenshot(path=str(SCREENSHOTS / f"site-{page.replace('/', '-')[:-5]}.png"))
            for link in tab.evaluate(LINKS_JS):
                to_follow.setdefault(link.split("#")[0], page)
        for link, source in sorted(to_follow.items()):
            try:
                images = _open_from_disk(tab, link)
            except Exception as err:  # noqa: BLE001 (playwright raises on a missing file: report it, then go on)
                problems.append(f"{source}: link {link} does not open ({str(err).splitlines()[0]})")
                continue
            problems += [f"{link}: image {i['src']} did not load" for i in images if i["natural"] == 0]
    finally:
        tab.close()
    assert len(to_follow) > 10, f"only {len(to_follow)} links found on {FROM_DISK_PAGES}"
    assert not problems, "\n".join(problems)


def test_following_links_from_disk_catches_a_missing_file(site_on_disk, tmp_path):
    """The link follower must notice a link to a missing page, or the test above could never fail."""
    _, browser = site_on_disk
    (tmp_path / "index.html").write_text('<a href="missing.html">x</a>')
    tab = browser.new_page()
    try:
        with pytest.raises(Exception, match="ERR_FILE_NOT_FOUND"):
            _open_from_disk(tab, (tmp_path / "missing.html").as_uri())
    finally:
        tab.close()


def test_search_works_from_disk(site_on_disk):
    """mkdocs-material's offline plugin embeds the search index, so searching works from file://, where a browser
    refuses to fetch search_index.json and the search box would say "Initializing search" for good."""
    site, browser = site_on_disk
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        tab.goto((site / "index.html").as_uri(), wait_until="load")
        query = tab.locator("input.md-search__input")      # in the header at this width
        query.click()
        tab.wait_for_function("() => document.querySelector('iframe') !== null", timeout=30_000)  # the worker
        query.press_sequentially("scale wipe", delay=30)    # typed: the theme searches on key events
        tab.wait_for_function("() => document.querySelectorAll('.md-search-result__item').length > 0",
                              timeout=30_000)
        meta = tab.locator(".md-search-result__meta").inner_text()
        links = tab.evaluate("() => [...document.querySelectorAll('.md-search-result__item a')].map(a => a.href)")
    finally:
        tab.close()
    assert "Initializing" not in meta, meta
    assert any("defects/scale-wipe.html" in link for link in links), links
