"""One number per quantity: tools/render_results.py, and README/docs/notebooks against results/.

The renderer is tested on small results files made in tmp_path (table and inline blocks, an unknown name, a second
run changing nothing). Then the repository itself: README.md and docs/**/*.md must be what the renderer makes of
results/*.json, and every quantity's `display` string must appear in the recorded outputs of the notebook its
results file names. Those two skip only while results/ holds no *.json yet.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"

_spec = importlib.util.spec_from_file_location("render_results", REPO / "tools" / "render_results.py")
render_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_results)


def _fixture(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    (repo / "docs" / "defects").mkdir(parents=True)
    (repo / "results" / "demo.json").write_text(json.dumps({
        "name": "demo", "command": "minikv repro demo --results results/demo.json", "model": "tiny",
        "notebook": "notebooks/99_demo.ipynb",
        "quantities": {"k_inflation": {"value": 41.2, "display": "x41", "statistic": "median of |K| ratios"}},
        "tables": {"damage": {"caption": "Damage per format.", "columns": ["format", "seqs", "damaged"],
                              "rows": [["int8", 4, "0-3"], ["fp8|x", 1056, "none"]]}},
    }))
    return repo


def test_inline_quantity_is_replaced_by_its_display(tmp_path):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "defects" / "a.md"
    page.write_text("K grows <!-- results:demo.quantities.k_inflation -->x33.5<!-- /results --> here.\n")
    assert render_results.render_repo(repo) == [page]
    assert page.read_text() == "K grows <!-- results:demo.quantities.k_inflation -->x41<!-- /results --> here.\n"


def test_table_block_is_rendered_as_markdown(tmp_path):
    repo = _fixture(tmp_path)
    (repo / "README.md").write_text("# R\n\n<!-- results:demo.tables.damage -->\nold table\n<!-- /results -->\n\nend\n")
    render_results.render_repo(repo)
    assert (repo / "README.md").read_text() == (
        "# R\n\n<!-- results:demo.tables.damage -->\n"
        "Damage per format.\n\n"
        "| format | seqs | damaged |\n"
        "|---|---:|---|\n"
        "| int8 | 4 | 0-3 |\n"
        "| fp8\\|x | 1,056 | none |\n\n"
        "(`results/demo.json`, written by `minikv repro demo --results results/demo.json`)\n"
        "<!-- /results -->\n\nend\n")


def test_rendering_is_idempotent(tmp_path):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "p.md"
    page.write_text("a <!-- results:demo.quantities.k_inflation --><!-- /results -->\n\n"
                    "<!-- results:demo.tables.damage --><!-- /results -->\n")
    assert render_results.render_repo(repo) == [page]
    once = page.read_text()
    assert render_results.render_repo(repo) == []
    assert page.read_text() == once
    assert render_results.main(["--repo", str(repo), "--check"]) == 0


def test_check_reports_a_stale_file_without_writing(tmp_path, capsys):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "p.md"
    page.write_text("a <!-- results:demo.quantities.k_inflation -->x40<!-- /results -->\n")
    assert render_results.main(["--repo", str(repo), "--check"]) == 1
    assert "docs/p.md" in capsys.readouterr().out
    assert "x40" in page.read_text()


@pytest.mark.parametrize("name", ["demo.quantities.v_inflation", "demo.tables.nope", "other.tables.damage",
                                  "demo.k_inflation"])
def test_unknown_name_is_a_clear_error(tmp_path, name):
    repo = _fixture(tmp_path)
    (repo / "docs" / "p.md").write_text(f"line 1\nline 2 <!-- results:{name} -->?<!-- /results -->\n")
    with pytest.raises(render_results.ResultsError) as info:
        render_results.render_repo(repo)
    message = str(info.value)
    assert "docs/p.md:2" in message and name in message
    assert "demo.quantities.k_inflation" in message and "demo.tables.damage" in message   # what exists
    assert render_results.main(["--repo", str(repo)]) == 2


def test_malformed_results_file_is_a_clear_error(tmp_path):
    repo = _fixture(tmp_path)
    (repo / "results" / "bad.json").write_text(json.dumps({"name": "other", "command": "x", "quantities": {},
                                                            "tables": {}}))
    with pytest.raises(render_results.ResultsError, match="file stem is 'bad'"):
        render_results.render_repo(repo)


CI_LOG = """$ bash tools/time_fresh_clone.sh
commit abc1234, 2026-12-02T02:00Z, 2 CPUs, load average before: 0.10
....
3 passed, 1 skipped in 300.50s (0:05:00)
4 passed in 60.00s (0:01:00)
4 passed in 90.00s (0:01:30)
\tElapsed (wall clock) time (h:mm:ss or m:ss): 9:30.50
exit status 0, load average after: 1.90
"""


def test_test_time_comes_from_the_timed_fresh_clone_run(tmp_path):
    log = tmp_path / render_results.CI_RUN
    log.parent.mkdir(parents=True)
    log.write_text(CI_LOG)
    q = render_results.load_test_time(tmp_path)["quantities"]
    assert [q[k]["display"] for k in ("wall", "pytest", "nbval_first", "nbval_second", "setup")] == \
        ["9.5 minutes", "5.0 minutes", "1.0 minutes", "1.5 minutes", "2.0 minutes"]
    assert q["pytest_counts"]["display"] == "3 passed, 1 skipped" and q["load_average"]["value"] == 0.10
    log.write_text(CI_LOG.replace("exit status 0", "exit status 2"))
    with pytest.raises(render_results.ResultsError, match="failed .exit status 2."):
        render_results.load_test_time(tmp_path)
    log.write_text(CI_LOG.replace("4 passed in 90.00s (0:01:30)\n", ""))
    with pytest.raises(render_results.ResultsError, match="found 2 summaries"):
        render_results.load_test_time(tmp_path)


MAKE_RUN_LOG = """$ /usr/bin/time -v make run
commit abc1234, 2026-12-03T06:43Z, 2 CPUs, load average before: 0.50
minikv demo on cpu
\tUser time (seconds): 5.50
\tSystem time (seconds): 0.25
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02.40
\tExit status: 0
exit status 0, load average after: 1.25
"""


def test_make_run_time_comes_from_its_timed_log(tmp_path):
    log = tmp_path / render_results.MAKE_RUN
    log.parent.mkdir(parents=True)
    log.write_text(MAKE_RUN_LOG)
    q = render_results.load_make_run(tmp_path)["quantities"]
    assert [q[k]["display"] for k in ("wall", "cpu", "load_average", "load_after")] == ["62 s", "6 s", "0.50", "1.25"]
    log.write_text(MAKE_RUN_LOG.replace("exit status 0,", "exit status 2,"))
    with pytest.raises(render_results.ResultsError, match="failed .exit status 2."):
        render_results.load_make_run(tmp_path)
    log.write_text(MAKE_RUN_LOG.replace("\tUser time (seconds): 5.50\n", ""))
    with pytest.raises(render_results.ResultsError, match="user and system"):
        render_results.load_make_run(tmp_path)


# ---- the repository -------------------------------------------------------------------------------------------

def _repo_results() -> dict[str, dict]:
    if not sorted(RESULTS.glob("*.json")):
        pytest.skip("results/ holds no *.json yet (`make results` writes them)")
    return render_results.load_results(RESULTS)


def test_readme_and_docs_are_in_sync_with_results():
    _repo_results()
    stale = render_results.render_repo(REPO, write=False)
    assert not stale, (f"{[str(p.relative_to(REPO)) for p in stale]} differ from results/*.json: run "
                       "`python tools/render_results.py` (or `make results` to measure again)")


def _recorded_text(notebook: Path) -> str:
    parts = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else text)
            for mime in ("text/plain", "text/markdown", "text/html"):
                value = out.get("data", {}).get(mime, "")
                parts.append("".join(value) if isinstance(value, list) else value)
    return "\n".join(parts)


def test_every_quantity_is_printed_by_its_notebook():
    for stem, data in _repo_results().items():
        assert "notebook" in data, (f"results/{stem}.json has no \"notebook\" key: the repro must name the notebook "
                                    "that prints its quantities (CONTRIBUTING.md, \"Results files\")")
        notebook = REPO / data["notebook"]
        assert notebook.exists(), f"results/{stem}.json names {data['notebook']}, which does not exist"
        recorded = _recorded_text(notebook)
        missing = [f"{q} ({e['display']!r})" for q, e in data["quantities"].items() if e["display"] not in recorded]
        assert not missing, f"{data['notebook']} does not print these quantities of results/{stem}.json: {missing}"


# ---- the rules the renderer enforces --------------------------------------------------------------------------

def test_an_inline_block_may_not_start_a_line(tmp_path):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "p.md"
    page.write_text("K grows by\n<!-- results:demo.quantities.k_inflation -->x41<!-- /results --> here.\n")
    with pytest.raises(render_results.ResultsError, match=r"docs/p.md:2: .*starts a line"):
        render_results.render_repo(repo)
    page.write_text("K grows\nby <!-- results:demo.quantities.k_inflation -->x41<!-- /results --> here.\n")
    render_results.render_repo(repo)


def test_a_table_block_stands_on_lines_of_its_own(tmp_path):
    repo = _fixture(tmp_path)
    (repo / "docs" / "p.md").write_text("see <!-- results:demo.tables.damage --><!-- /results -->\n")
    with pytest.raises(render_results.ResultsError, match="lines of its own"):
        render_results.render_repo(repo)


GPU_CSV = """GBps,batch,bytes,context,copy_GBps,format,gpu,kind,ms,pct_copy,q_len,read_GBps,sdpa_ms,sdpa_over_minikv,torch,triton,TFLOPs,unfused_over_fused,kernel,tokens_per_s
1000,64,1000000,4096,4000,auto,H,decode,0.25,25,,4100,0.2,0.8,t,r,,,dot,
900,64,500000,4096,4000,fp8,H,decode,0.125,22.5,,4100,0.2,1.6,t,r,,,dot,
,8,,4096,4000,"self causal, torch SDPA",H,prefill,1.0,,4096,4100,,,t,r,600,,,
,8,,4096,4000,"self causal, workspace (unfused)",H,prefill,2.0,,4096,4100,,,t,r,300,,,
,64,,2048,4000,auto,H,engine-decode,50.0,,,4100,,,t,r,,,,1280
,64,,2048,4000,fp8,H,engine-decode,40.0,,,4100,,,t,r,,,,1600
"""


def test_gpu_figures_come_from_the_csv_and_follow_it(tmp_path):
    """The GPU quantities and tables are computed from the CSV (added columns, text ones included, and added kinds
    of row change nothing they do not add): a new run of the benchmark flows through to every page without hand
    edits."""
    pytest.importorskip("torch")
    repo = tmp_path / "repo"
    (repo / "notebooks" / "data").mkdir(parents=True)
    (repo / "results").mkdir()
    (repo / "notebooks" / "data" / "gpu_attention.csv").write_text(GPU_CSV)
    gpu = render_results.load_gpu(repo)
    assert gpu["quantities"]["x_bf16_fp8_b64_c4096"]["display"] == "2.00x"
    assert gpu["quantities"]["us_auto_b64_c4096"]["display"] == "250.0 µs"
    assert gpu["quantities"]["prefill_x_sdpa_workspace_unfused"]["display"] == "0.50x"
    assert [row[0] for row in gpu["tables"]["context"]["rows"]] == ["self causal, torch SDPA",
                                                                    "self causal, workspace (unfused)"]
    assert gpu["quantities"]["engine_x_bf16_fp8"]["display"] == "1.25x"          # rows a newer run adds
    targets = {row[0]: row for row in gpu["tables"]["targets"]["rows"]}
    assert targets["fp8 vs bf16 paged decode, batch 64, context 4096"][2:] == ["2.000x", "met"]
    page = repo / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("fp8 is <!-- results:gpu.quantities.x_bf16_fp8_b64_c4096 -->?<!-- /results --> faster.\n")
    render_results.render_repo(repo)
    assert "-->2.00x<!--" in page.read_text()


CROSS_LOG = """B1 cross-stride: fp8 cross pool sized as a multiple of the 10 blocks the requests need at once
        pool blocks | buggy, sanitizer on      buggy, sanitizer off         fixed, sanitizer on  fixed, sanitizer off
       1.00x     10 | overrun caught           wrong tokens (6/6 requests)  correct              correct
       2.00x     20 | correct                  correct                      correct              correct
version        context path   context step  decode steps  token ids = auto  fused read reaches
historical     fused               5.1e+09         < 0.1  no                byte 42,240 of 786,432
fallback       unfused               < 0.1         < 0.1  yes               -
taught-fused   fused                 < 0.1         < 0.1  yes               byte 40,576 of 786,432
  9 blocks (1.00x): 0, 1, 2; 18 blocks (2.00x): none
"""


def _cpu_results(b1_silent_1x="wrong tokens (6 of 6)", b2_wrong="6 of 6"):
    damage = {"columns": ["kv_cache_dtype", "max_num_seqs", "prefix caching", "damaged (buggy)", "damaged (fixed)",
                          "K inflation", "V inflation", "fills that wiped nothing", "late fills that wiped"],
              "rows": [["int8_per_token_head", 4, "off", "0-3", "none", "x41", "x55", 6, 2]]}
    cross = {"b1_pool_sizes": {"columns": ["pool factor", "blocks", "buggy, sanitizer on", "buggy, sanitizer off",
                                           "fixed, sanitizer on", "fixed, sanitizer off"],
                               "rows": [["1x", 10, "overrun caught", b1_silent_1x, "correct", "correct"],
                                        ["2x", 20, "correct", "correct", "correct", "correct"]]},
             "b2_context_read": {"columns": ["version", "context path", "context step", "decode steps", "wrong"],
                                 "rows": [["historical", "fused", "6.2", "< 0.001", b2_wrong],
                                          ["fallback", "unfused", "< 0.001", "< 0.001", "0 of 6"],
                                          ["taught-fused", "fused", "< 0.001", "< 0.001", "0 of 6"]]},
             "identical_requests": {"columns": ["blocks", "pool factor", "copies differing"],
                                    "rows": [[9, "1.00x", "0, 1, 2"], [18, "2.00x", "none"]]}}
    return {"scale_wipe": {"tables": {"damage": damage}}, "cross_stride": {"tables": cross}}


def test_cpu_vs_gpu_says_what_is_the_same_and_what_differs(tmp_path):
    (tmp_path / "results" / "gpu").mkdir(parents=True)
    (tmp_path / "results" / "gpu" / "cross.log").write_text(CROSS_LOG)
    cuda = {"cross_stride_cuda": render_results.load_cross_stride_cuda(tmp_path),
            "scale_wipe_cuda": {"tables": {"damage": _cpu_results()["scale_wipe"]["tables"]["damage"]}}}
    both = render_results.compare_cpu_gpu(_cpu_results(), cuda)
    assert both["quantities"]["categorical_verdict"]["display"] == "all the same"
    differences = {row[0]: row for row in both["tables"]["differences"]["rows"]}
    assert differences["B2 historical: context-step error"][1:] == ["float magnitude", "6.2", "5.1e+09"]
    assert "B1 1x pool, buggy, sanitizer off: outcome" not in differences        # "wrong tokens" on both
    # A categorical outcome that differs is reported as one, and the verdict says so.
    both = render_results.compare_cpu_gpu(_cpu_results(b1_silent_1x="correct", b2_wrong="0 of 6"), cuda)
    assert both["quantities"]["categorical_verdict"]["display"] == "the same except 2"
    kinds = {row[0]: row[1] for row in both["tables"]["differences"]["rows"]}
    assert kinds["B1 1x pool, buggy, sanitizer off: outcome"] == "categorical"


def test_cross_log_that_is_not_the_repro_output_is_a_clear_error(tmp_path):
    with pytest.raises(render_results.ResultsError, match="expected the B1 table"):
        render_results.parse_cross_log("nothing here\n")


# ---- one number per quantity, in the prose ---------------------------------------------------------------------

# A figure that looks measured: a time, a bandwidth, a share, a ratio or factor, an inflation, "N of M".
MEASURED = re.compile(r"(?<![\w.#/-])(?:"
                      r"\d[\d,]*(?:\.\d+)?\s?(?:µs|ms|GB/s|TB/s|TFLOP/s|%)"
                      r"|\d[\d,]*(?:\.\d+)?\s(?:s|min|minutes|seconds)\b"
                      r"|\d+(?:\.\d+)?\s?[x×](?![\w])"
                      r"|[x×]\d[\d,]*(?:\.\d+)?\b"
                      r"|\d[\d,]* of \d[\d,]*\b)")
# Figures that may stand in prose without a results block, each with the reason it is not a measurement of
# minikv's (or has no results file). Anything else that looks measured must come through the renderer.
NOT_MEASURED = {
    # pool sizes: the inputs of the cross-stride runs, not outputs
    "0.75x": "a pool factor", "1x": "a pool factor", "1.5x": "a pool factor", "1.99x": "a pool factor",
    "2x": "a pool factor or the 2x of the doubled stride", "3x": "a pool factor", "4x": "a float32 model's 4x",
    # upstream's figures, as the shared/upstream texts give them (tests/test_provenance.py checks citations)
    "x221": "upstream K inflation", "x24": "upstream V inflation",
    # targets and tolerances: goals and bounds, not results
    "1.7x": "a performance target", "1.8x": "a performance target", "1%": "the GPU parity test's tolerance",
    "1.10x": "the end-to-end anchor, vLLM's reported figure",
}


def _prose(text: str) -> str:
    """The text a reader reads as prose: results blocks, fenced code and code spans removed."""
    text = render_results.BLOCK.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    return re.sub(r"`[^`\n]*`", " ", text)


def test_readme_and_docs_quote_measured_figures_only_through_the_renderer():
    pages = render_results.target_files(REPO)
    bad = []
    for page in pages:
        for number, line in enumerate(_prose(page.read_text()).splitlines(), 1):
            bad += [f"{page.relative_to(REPO)}:{number}: {m.group(0)!r}" for m in MEASURED.finditer(line)
                    if m.group(0) not in NOT_MEASURED]
    assert not bad, ("measured-looking figures typed into the prose (quote them through a results block, "
                     "`python tools/render_results.py --list` names them):\n" + "\n".join(bad))


def test_no_line_of_readme_or_docs_starts_with_a_results_marker():
    bad = [f"{page.relative_to(REPO)}:{number}" for page in render_results.target_files(REPO)
           for number, line in enumerate(page.read_text().splitlines(), 1)
           if re.match(r" {0,3}<!-- results:[^ ]*\.quantities\.", line)]
    assert not bad, f"inline results blocks that start a line (they split the paragraph): {bad}"


@pytest.mark.parametrize("notebook", sorted((REPO / "notebooks").glob("0*.ipynb")), ids=lambda p: p.stem)
def test_notebook_prose_quotes_only_what_the_notebook_prints(notebook):
    """A figure a notebook's text quotes is the one its code printed (same digits), or not a measurement."""
    cells = json.loads(notebook.read_text())["cells"]
    printed = _recorded_text(notebook)
    bad = []
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for m in MEASURED.finditer(_prose("".join(cell["source"]))):
            if m.group(0) not in printed and m.group(0) not in NOT_MEASURED:
                bad.append(m.group(0))
    assert not bad, f"{notebook.name}: the prose quotes figures its recorded outputs do not print: {bad}"
