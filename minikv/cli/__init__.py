"""The `minikv` command: demo, generate, eval, train, repro, bench, checkpoint, bugs, hunt. See docs/internals.md#cli."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback

from minikv.config import BACKENDS, BLOCK_SIZES, KV_CACHE_DTYPES
from minikv.engine.arguments import UsageParser, byte_count, model_arg, positive_int, share, whole_number


def _cmd_demo(args) -> int:
    from minikv.cli import demo
    return demo.main(device=args.device)


def unknown_only(tokenizer, prompt: str) -> str | None:
    """The unknown token a prompt encodes to when it encodes to nothing else (a Hugging Face tokenizer's `[UNK]`
    for text it has no tokens for), else None."""
    inner = getattr(tokenizer, "_tok", None)           # minikv.models.dir_tokenizer.HFTokenizer's tokenizers object
    unk = getattr(getattr(inner, "model", None), "unk_token", None)
    unk_id = inner.token_to_id(unk) if unk is not None else None
    if unk_id is None:
        return None
    ids = tokenizer.encode(prompt)
    return unk if ids and all(i == unk_id for i in ids) else None


def _cmd_generate(args) -> int:
    import minikv
    # The sampling options are checked first: a bad one costs no model load.
    params = minikv.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                   top_k=args.top_k, min_p=args.min_p, seed=args.seed, n=args.n, stop=args.stop)
    llm = minikv.LLM(model=args.model, kv_cache_dtype=args.kv_cache_dtype, device=args.device,
                     backend=args.backend, max_num_seqs=args.max_num_seqs, **cache_options(args))
    for prompt in args.prompts:
        unk = unknown_only(llm.tokenizer, prompt)
        if unk is not None:
            raise ValueError(f"prompt {prompt!r} encodes to the unknown token {unk!r} only: {args.model}'s tokenizer "
                             f"has no token for its characters, so the model would see nothing of it")
    for prompt, out in zip(args.prompts, llm.generate(args.prompts, params, use_tqdm=sys.stderr.isatty())):
        for c in out.outputs:
            if args.ids:
                prompt_ids = llm.tokenizer.encode(prompt)
                print(f"{prompt!r} {prompt_ids} -> {list(c.token_ids)}  [{c.finish_reason}]")
            else:
                print(f"{prompt!r} -> {c.text!r}  [{c.finish_reason}]")
    return 0


def cache_options(args) -> dict:
    """The LLM keywords of the cache-sizing options (engine_args), those given on the command line only."""
    names = ("block_size", "num_blocks", "max_model_len", "kv_cache_memory_bytes", "gpu_memory_utilization",
             "kv_sharing_fast_prefill")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _cmd_eval(args) -> int:
    from minikv.bench import accuracy
    result = accuracy.exact_match(args.model, args.kv_cache_dtype, n=args.n, device=args.device,
                                  backend=args.backend, max_num_seqs=args.max_num_seqs, task=args.task,
                                  **cache_options(args))
    print(result.report())
    return 0


def _cmd_train(args) -> int:
    from minikv.models import train
    metrics = train.train(args.model, steps=args.steps, seed=args.seed, out_dir=args.out_dir)
    print(metrics)
    print(f"checkpoint written to {args.out_dir}/{args.model}/; to ship it, copy it over "
          f"minikv/models/weights/{args.model}/")
    return 0


# What kind of model each defect's mechanism needs, and a shipped model that has it.
MODEL_KIND_NEEDED = {
    "scale-wipe": ("decoder-only", "a decoder-only model with KV-sharing layers (num_kv_shared_layers > 0 in its "
                                   "config.json), such as tiny-gemma4"),
    "cross-stride": ("encoder-decoder", "an encoder-decoder model with cross attention (a T5), such as tiny-t5"),
    "cross-fp8-context-read": ("encoder-decoder", "an encoder-decoder model with cross attention (a T5), such as "
                                                  "tiny-t5"),
}
REPRODUCTIONS = {  # name: (module, the defects it reproduces, what it shows)
    "scale-wipe": ("minikv.repro.scale_wipe", ("scale-wipe",),
                   "vLLM's scale wipe: KV-sharing layers wipe the inline KV scales of the whole first batch"),
    "cross-stride": ("minikv.repro.cross_stride", ("cross-stride", "cross-fp8-context-read"),
                     "TensorRT-LLM's FP8 cross attention: the doubled cross-pool stride, then the fused context "
                     "read of the FP8 pool as 16-bit"),
}


def model_kind(model: str) -> str:
    """"encoder-decoder", "decoder-only" (with KV-sharing layers) or "decoder-only without KV sharing", read from a
    shipped model's config or a checkpoint directory's config.json (ModelLoadError for a directory that has none)."""
    from minikv.models import hf_checkpoint, registry
    if registry.is_checkpoint_model(model):
        config = registry.CHECKPOINT_CONFIGS[model]
    elif hf_checkpoint.is_checkpoint_dir(model):
        try:
            config = hf_checkpoint.read_config(model)
        except hf_checkpoint.CheckpointError as err:
            raise registry.ModelLoadError(str(err), hint=err.hint) from None
        config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    elif os.path.isdir(model):
        raise ValueError(f"{model!r} is not a checkpoint directory: it has no config.json (expected transformers' "
                         f"config.json + model.safetensors of a Gemma-4 or T5 model)")
    else:
        return "unknown"                         # LLM(...) says what is wrong with it
    if config.get("model_type") == "t5" or config.get("is_encoder_decoder"):
        return "encoder-decoder"
    return "decoder-only" if (config.get("num_kv_shared_layers") or 0) > 0 else "decoder-only without KV sharing"


def _check_model_kind(defects, model: str, what: str) -> None:
    """Refuse, before anything runs, a defect whose mechanism the model cannot have, saying which kind it needs."""
    kind = model_kind(model)
    if kind == "unknown":
        return
    for name in defects:
        needed, description = MODEL_KIND_NEEDED[name]
        if kind != needed:
            raise ValueError(f"{what} {name} needs {description}; {model} is "
                             f"{'an' if kind[0] in 'ae' else 'a'} {kind} model")


def _option(rest: list[str], name: str) -> str | None:
    """The value of option `name` in a subcommand's own arguments (`--name VALUE` or `--name=VALUE`), or None."""
    for i, arg in enumerate(rest):
        if arg == name and i + 1 < len(rest):
            return rest[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _cmd_repro(args) -> int:
    import importlib
    if args.defect is None:
        print("usage: minikv repro DEFECT [options]: reproduce a historical defect on a buggy and a fixed engine "
              "and check its upstream signatures (exit 0: all reproduced). The reproductions:")
        for name, (_, defects, what) in REPRODUCTIONS.items():
            print(f"  {name:14} {what} (the defects {', '.join(defects)} of `minikv bugs`)")
            print(f"  {'':14} needs {MODEL_KIND_NEEDED[name][1]}; its options: minikv repro {name} --help")
        return 0
    module, defects, _ = REPRODUCTIONS[args.defect]
    model = _option(args.rest, "--model")
    if model is not None:
        _check_model_kind(defects[:1], model, f"minikv repro {args.defect}: the reproduction of")
    return importlib.import_module(module).main(args.rest)


def _cmd_bench(args) -> int:
    from minikv.bench import main as bench_main
    return bench_main([args.what] + args.rest)


def _cmd_hunt(args) -> int:
    from minikv.hunt import cli as hunt_cli
    command = "minikv " + shlex.join(args.argv)
    if args.every_defect:
        if args.backend in hunt_cli.FOREIGN_BACKENDS:
            raise ValueError(f"--every-defect hunts minikv's engine; leave out --backend {args.backend}")
        if args.reintroduce:
            raise ValueError("--every-defect hunts the fixed engine and then every defect in turn: leave out "
                             "--reintroduce")
        return _hunt_every_defect(args, command)
    if args.reintroduce and args.model:
        _check_model_kind(args.reintroduce, args.model, "--reintroduce")
    label = ("the fixed engine" if not args.reintroduce
             else "with " + ", ".join(args.reintroduce) + " reintroduced")
    return hunt_cli.run(args, label=label, command=command)


# The check each upstream test matrix lacked, run alone: (what it is, the defect it would have caught, the invariant).
UPSTREAM_CHECKS = (("first batch vs a later one (vLLM)", "scale-wipe", "repeat-identical"),
                   ("dense reference alone, pools down to the need (TensorRT-LLM's golden)", "cross-stride",
                    "matches-reference"))


def _hunt_every_defect(args, command: str) -> int:
    """`minikv hunt --every-defect`: the fixed engine, then each registered defect, one line each, and the
    tolerance of one row worked through."""
    import os

    from minikv.defects.registry import DEFECTS
    from minikv.hunt import cli as hunt_cli
    from minikv.hunt import hunt
    from minikv.hunt.reference import DenseReference
    from minikv.hunt.strategies import cell_label
    hunt_cli.check_outputs(args)
    if args.model:
        from minikv.models import registry
        registry.check_loadable(args.model)            # a bad model is one error line, before the first bar
    load = os.getloadavg()[0]
    reference = DenseReference()
    common = dict(model=args.model, backend=args.backend, seed=args.seed, budget_s=args.budget,
                  max_scenarios=args.max_scenarios or None, oracles=args.oracle, reference=reference)
    reports = {"the fixed engine": hunt(**common)}
    fixed = reports["the fixed engine"]
    print(f"the fixed engine: {fixed.text().splitlines()[0]}")
    ok = not fixed.found
    rows, quantities, skipped = [], {}, []
    for name in DEFECTS:
        try:
            report = hunt(reintroduce=(name,), **common)
        except ValueError as err:                   # every cell refused: the model cannot have this defect
            if "refused every scenario" not in str(err):
                raise
            skipped.append(name)
            print(f"{name}: not applicable: {str(err).split('its first refusal: ')[-1]}")
            continue
        reports[f"with {name} reintroduced"] = report
        f = report.finding
        ok = ok and f is not None
        if f is None:
            print(f"{name}: NOT FOUND: {report.text()}")
            rows.append([name, "-", "-", "-", "-", "-", f"{report.seconds:.1f} s"])
        else:
            invariants = ", ".join(dict.fromkeys(v.oracle for v in f.violations))
            print(f"{name}: found by {invariants} in cell {cell_label(f.cell)} at scenario {f.scenarios_before + 1} "
                  f"({f.seconds_to_find:.1f} s), shrunk in {f.shrink_runs} runs")
            rows.append([name, invariants, cell_label(f.cell), str(f.scenarios_before + 1),
                         f"{f.seconds_to_find:.1f} s", str(f.shrink_runs), f"{report.seconds:.1f} s"])
        quantities[f"{name.replace('-', '_')}_wall"] = {
            "value": round(report.seconds, 1), "display": f"{report.seconds:.1f} s",
            "statistic": f"seconds `minikv hunt --reintroduce {name}` spent searching and shrinking (in-process, "
                         f"after start-up), {args.backend} backend"}
    checks = []
    for title, name, oracle in UPSTREAM_CHECKS:
        if name in skipped:
            continue
        report = hunt(reintroduce=(name,), **{**common, "oracles": (oracle,)})
        reports[f"with {name} reintroduced, {oracle} alone"] = report
        f = report.finding
        print(f"{title}: {name} {'found' if f else 'not found'} by {oracle} alone"
              + (f" at scenario {f.scenarios_before + 1} ({f.seconds_to_find:.1f} s)" if f else ""))
        checks.append([title, name, oracle, "found" if f else "not found",
                       str(f.scenarios_before + 1) if f else "-", f"{f.seconds_to_find:.1f} s" if f else "-"])
    example = _tolerance_example(reference, fixed.cells[0][0])
    used = max(fixed.tolerance_used.values(), default=0.0)
    print(f"logits: the fixed engine used at most {used:.2f} of a row's tolerance")
    budget = f"budget {args.budget:g} s" + (f", at most {args.max_scenarios} scenarios" if args.max_scenarios else "")
    quantities.update({
        "fixed_scenarios": {"value": fixed.scenarios_run, "display": f"{fixed.scenarios_run} scenarios",
                            "statistic": f"scenarios `minikv hunt --budget {args.budget:g}` ran on the fixed engine, "
                                         f"all clean" if not fixed.found else "scenarios run on the fixed engine"},
        "budget": {"value": args.budget, "display": f"{args.budget:g} s",
                   "statistic": "the --budget of every hunt measured here"},
        "load_average": {"value": round(load, 1), "display": f"load average {load:.1f}",
                         "statistic": f"1-minute load average of the {os.cpu_count()}-core machine when the "
                                      f"measurement started (shared with other sessions)"},
        "tolerance_used": {"value": round(used, 2), "display": f"{used:.2f} of its tolerance",
                           "statistic": "largest |engine - reference| / tolerance over every logits row the fixed "
                                        "engine's hunt compared (minikv.hunt.logit_tolerance)"},
    })
    if args.results:
        models = sorted({c[0] for c in fixed.cells}, key=lambda m: [c[0] for c in fixed.cells].index(m))
        hunt_cli.write_json(args.results, {
            "name": "hunt", "command": command, "model": ", ".join(cell_label((m,)) for m in models),
            "notebook": "notebooks/06_catching_defects.ipynb", "quantities": quantities,
            "tables": {
                "defects": {"caption": f"Each historical defect found blind by `minikv hunt` ({args.backend} backend, "
                                       f"{budget}, seed {args.seed}; {os.cpu_count()}-core CPU at load average "
                                       f"{load:.1f})",
                            "columns": ["defect", "invariant", "cell", "scenario", "to the finding", "shrink runs",
                                        "hunt time"],
                            "rows": rows},
                "upstream_checks": {"caption": "The check each upstream test matrix lacked (minikv's reading), "
                                               "run alone",
                                    "columns": ["check", "defect", "invariant", "outcome", "scenario",
                                                "to the finding"],
                                    "rows": checks},
                "tolerance_example": example},
            # each hunt's report, less its list of scenarios (thousands; the same seed tries them again, and
            # `minikv hunt --results` for one hunt lists them)
            "tolerance_used": {
                "statistic": "largest |engine - reference| / tolerance of the fixed engine's logits rows (same "
                             "context), per cell, over every scenario of the fixed engine's hunt",
                "largest_share": {cell_label(c): float(f"{d:.3g}") for c, d in fixed.tolerance_used.items()}},
            "hunts": {label: {k: v for k, v in hunt_cli.results_data(r, command, label).items() if k != "scenarios"}
                      for label, r in reports.items()}})
        print(f"results written to {args.results}")
    if args.plot:
        hunt_cli.save_plot(args.plot, reports)
        print(f"search map written to {args.plot}")
    return 0 if ok else 1


def _tolerance_example(reference, model: str) -> dict:
    """The tolerance of one logits row worked through (docs/hunt.md): the first prompt of `model`'s pool, an int8
    cache in float32, the row before its first generated token, each term with the fixed engine's deviation."""
    from minikv.hunt import MinikvEngine, Request, Scenario
    from minikv.hunt.logit_tolerance import SAMPLES
    from minikv.hunt.strategies import prompt_pool
    prompt = prompt_pool(model)[0]
    fmt, dtype = "int8_per_token_head", "float32"
    ref = reference.get(model, fmt, dtype, prompt, 1)
    run = MinikvEngine().run(Scenario(model, fmt, dtype, requests=(Request(prompt, 1),)))
    t = ref.terms[0]
    deviation = float((run.requests[0].logits[0].double() - ref.logits[0]).abs().max())
    rows = [["L, n", f"{t.layers}, {t.inner}", "the model's layers, its longest dot product (from its config)"],
            ["γ = (L + 1) √n", f"{t.gamma:.1f}", "how many unit roundoffs the final hidden state may be off by"],
            [f"u ({dtype})", f"{t.u:.3g}", "unit roundoff of the activation dtype"],
            ["max_v |W_v| |h|", f"{t.bound:.3g}", "unembedding row norm times final hidden norm (reference)"],
            ["compute = γ u max_v |W_v| |h|", f"{t.compute:.3g}", "rounding of the engine's own arithmetic"],
            ["own", f"{t.own:.3g}", f"the dense model run in {dtype} against float64 (same prompt, same cache "
                                    f"format)"],
            ["spread", f"{t.spread:.3g}", f"the largest move over {SAMPLES} runs of the float64 model whose dot "
                                          f"products round at random as {dtype}'s may"],
            ["flip", f"{t.flip:.3g}", "the moves of the reference's logits, summed, each group of codes within reach "
                                      "of a rounding boundary flipped alone"],
            ["tolerance = 2 (compute + max(own, spread) + flip)", f"{t.total:.3g}", "in logits, for this row"],
            ["the fixed engine's deviation", f"{deviation:.3g}", f"max |engine - reference| over the row "
                                                                 f"({deviation / t.total:.2g} of the tolerance)"]]
    return {"caption": f"The tolerance of one row worked through: {model}, {fmt} x {dtype}, prompt {prompt!r}, "
                       f"the logits before the first generated token (`minikv hunt --every-defect`)",
            "columns": ["term", "value", "what it is"], "rows": rows}


def _cmd_checkpoint(args) -> int:
    from minikv.models import new_checkpoint
    path = new_checkpoint.write(args.dir, arch=args.arch, size=args.size, seed=args.seed, force=args.force,
                                progress=sys.stderr.isatty())
    print(f"{args.arch} {args.size} checkpoint with random weights written to {path}/; run it with "
          f"minikv generate --model {shlex.quote(str(path))} --ids '3 7 11'")
    return 0


def _cmd_bugs(args) -> int:
    from minikv.defects import registry
    print(registry.table())
    return 0


HUNT_DESCRIPTION = """\
Search engine configurations for a violated KV-cache invariant, the way a differential tester does: hypothesis
draws scenarios, each runs on the engine, six invariants are checked, and a failure is shrunk to a minimal scenario
printed as a program that, run as printed, shows the failure (expected beside seen) and exits 1.
Exit status: 0 nothing found within the budget, 1 an invariant failed, 2 bad input."""
HUNT_WORDS = """\
words in the output:
  scenario     one engine configuration (max_num_seqs, block size, pool sizes, prefix caching, ...) and the
               requests it serves; the unit the hunter draws, runs, checks and shrinks
  cell         one (model, KV cache format, activation dtype) of the matrix: each cell gets its own search, and
               the cells take turns in rounds of 1, 2, 4, ... scenarios
  invariant    what must hold for every scenario (runs, writes-in-bounds, kernels-match-references,
               repeat-identical, schedule-invariant, matches-reference: docs/hunt.md)
  refused by the engine
               a scenario the engine will not build (its own input checks raise ValueError, e.g. a defect switched
               on where its mechanism cannot occur): outside its domain, not a failure
  wave         the requests of a scenario are submitted in waves: wave 0 first, and, when the scenario repeats,
               wave 1 the same requests again once wave 0 has finished
  near tie     a divergence from the dense reference where its logits for the two tokens are within twice that
               row's tolerance (docs/hunt.md): excused, since rounding in another order may swap them
  shrunk       the smallest failing scenario hypothesis reached from the first failing one
  reproduction a Python program of the shrunk scenario that checks the invariant itself
  family       with --backend flexattention, sdpa or flashinfer: one kind of kernel-level scenario (block tables,
               GQA, head sizes, block sizes, sliding windows, KV sharing, cross pools, fp8 scales) run against
               that attention backend alone; pass, fail or skipped (with the backend's reason): docs/backends.md
with --model DIR (a checkpoint directory in transformers' format), the prompts come from its own tokenizer, the
cells from what its config has (every KV cache format, both activation dtypes), and the dense reference from the
same weights."""


def demo_doc() -> str:
    """`minikv demo --help`'s description: the demo module's own docstring, so it says what the demo does today."""
    from minikv.cli import demo
    return " ".join(demo.__doc__.split("\n\n")[0].split())


def build_parser() -> argparse.ArgumentParser:
    import minikv
    from minikv.models.registry import MODEL_NAMES
    p = UsageParser(prog="minikv", description=__doc__.splitlines()[0],
                    epilog="Every error is one line, `minikv: error: MESSAGE (hint: WHAT TO DO)`. Exit status: 0 "
                           "done; 1 a found defect or failed check (a hunt's finding, a reproduction whose "
                           "signatures do not hold, the sanitizer catching an overrun); 2 bad input (an argument, "
                           "a checkpoint directory or a prompt minikv cannot take); 3 an engine fault (a fault in "
                           "minikv itself: run again with --traceback and report it).")
    p.add_argument("--version", action="version", version=f"minikv {minikv.__version__}")
    p.add_argument("--traceback", action="store_true",
                   help="on an error, print the traceback before the one-line message (anywhere on the command "
                        "line; or set MINIKV_TRACEBACK=1)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the main job: the kernels against their references per KV cache format, then "
                                    "each defect reproduced and fixed in a few lines (exit 1 if one is not as "
                                    "expected)",
                       description=demo_doc())
    d.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    d.set_defaults(func=_cmd_demo)

    def engine_args(sp):
        model_arg(sp)
        sp.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
        sp.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
        sp.add_argument("--backend", default="triton", choices=BACKENDS)
        sp.add_argument("--max-num-seqs", type=positive_int, default=8)
        sp.add_argument("--block-size", type=int, default=None, choices=BLOCK_SIZES,
                        help="tokens per KV-cache block (default 16)")
        sp.add_argument("--num-blocks", type=positive_int, default=None,
                        help="blocks of each self-attention pool (default: from the memory budget)")
        sp.add_argument("--max-model-len", type=whole_number(2), default=None,
                        help="the longest prompt + max tokens a request may have (default: the model's context "
                             "length, or what the cache holds if less)")
        sp.add_argument("--kv-cache-memory-bytes", type=byte_count, default=None, metavar="SIZE",
                        help="the KV-cache budget, in bytes or as 64MiB, 1GiB (default: 64MiB on CPU; on CUDA "
                             "--gpu-memory-utilization decides)")
        sp.add_argument("--gpu-memory-utilization", type=share, default=None, metavar="FRACTION",
                        help="CUDA: the share of the device's memory the engine may use (default 0.9)")
        sp.add_argument("--kv-sharing-fast-prefill", action="store_true", default=None,
                        help="prefill: the layers that share K/V (Gemma-4) run on each prompt's last token only")

    g = sub.add_parser("generate", help="generate continuations for prompts (sampled as vLLM's defaults; "
                                        "--temperature 0 for greedy)",
                       description="Generate a continuation for each prompt and print it as `'prompt' -> 'text'  "
                                   "[finish reason]` (--n of them per prompt); with --ids, the token ids instead of "
                                   "the text. The sampling options and their defaults are minikv.SamplingParams' "
                                   "(vLLM's): temperature 1.0, so pass --temperature 0 for greedy output.")
    engine_args(g)
    g.add_argument("prompts", nargs="+", help="the prompts (a shipped model takes only prompts of its task's "
                                              "domain; a checkpoint directory takes any text its tokenizer encodes)")
    g.add_argument("--ids", action="store_true",
                   help="print the prompt's and the continuation's token ids instead of the text (a random-weight "
                        "model's text is often unreadable)")
    g.add_argument("--max-tokens", type=positive_int, default=16, help="new tokens per prompt (default 16)")
    g.add_argument("--temperature", type=float, default=1.0, help="0 for greedy (default 1.0, as vLLM's)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: 0 < p <= 1 (default 1: off)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top one's probability")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: from the engine's seed)")
    g.add_argument("--n", type=positive_int, default=1, help="completions per prompt (default 1)")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="a stop string (repeat for several): the text is cut before it")
    g.set_defaults(func=_cmd_generate)

    e = sub.add_parser("eval", help="greedy exact match on held-out prompts of the model's task")
    engine_args(e)
    e.add_argument("--n", type=positive_int, default=200, help="number of held-out prompts (at least 1)")
    e.add_argument("--task", default=None, choices=MODEL_NAMES,
                   help="whose task's prompts (default: the model's; for a checkpoint directory, its directory "
                        "name when that is a shipped model's, as `minikv train` writes them)")
    e.set_defaults(func=_cmd_eval)

    t = sub.add_parser("train", help="train a shipped model from scratch (writes a checkpoint directory)")
    t.add_argument("model", choices=MODEL_NAMES)
    t.add_argument("--steps", type=positive_int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out-dir", default="build/weights", help="where to write the weights (default build/weights; "
                                                             "the shipped weights are never overwritten)")
    t.set_defaults(func=_cmd_train)

    r = sub.add_parser("repro", help="reproduce a historical defect, buggy and fixed, and check its signatures "
                                     "(without a defect: list them)",
                       description="Reproduce a historical defect on a buggy and a fixed engine and check the "
                                   "signatures upstream reported (exit 0: all reproduced, 1: one is missing). "
                                   "scale-wipe needs a decoder-only model with KV-sharing layers; cross-stride (with "
                                   "the FP8 context read) an encoder-decoder model. `minikv repro DEFECT --help` "
                                   "lists a reproduction's own options.")
    r.add_argument("defect", nargs="?", default=None, choices=tuple(REPRODUCTIONS), metavar="DEFECT",
                   help="which reproduction: " + ", ".join(REPRODUCTIONS) + " (leave out to list them)")
    r.add_argument("rest", nargs=argparse.REMAINDER, metavar="...", help="the reproduction's own options")
    r.set_defaults(func=_cmd_repro)

    from minikv.bench import DESCRIPTIONS
    b = sub.add_parser("bench", help="benchmarks (kernels, engine, attention)",
                       description="benchmarks: " + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
    b.add_argument("what", choices=tuple(DESCRIPTIONS), help="which benchmark: " + ", ".join(DESCRIPTIONS))
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)

    c = sub.add_parser("checkpoint", help="make a checkpoint directory (random weights, transformers' format)")
    csub = c.add_subparsers(dest="action", required=True)
    n = csub.add_parser("new", help="write a random-weight checkpoint: config.json, model.safetensors, tokenizer.json",
                        description="Write a random-weight checkpoint directory in transformers' format (config.json, "
                                    "model.safetensors in bfloat16, tokenizer.json, tokenizer_config.json) that "
                                    "minikv and transformers both load: tiny for experiments and tests; gemma4 e2b "
                                    "is gemma-4-E2B's text config in full (about 10 GB), t5 base flan-t5-base's.")
    n.add_argument("dir", help="the directory to write (new or empty; an existing one needs --force)")
    n.add_argument("--arch", required=True, choices=("gemma4", "t5"))
    n.add_argument("--size", default="tiny", choices=("tiny", "e2b", "base"),
                   help="tiny (both), e2b (gemma4), base (t5); default tiny")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--force", action="store_true", help="write into a non-empty directory")
    n.set_defaults(func=_cmd_checkpoint)

    s = sub.add_parser("bugs", help="list the historical defects minikv can reintroduce")
    s.set_defaults(func=_cmd_bugs)

    # `minikv hunt`: its options live in minikv/hunt/cli.py; --reintroduce is checked here against the
    # registry, so the hunter itself never reads defect names.
    from minikv.defects.registry import DEFECTS
    from minikv.hunt.cli import add_arguments as hunt_arguments
    h = sub.add_parser("hunt", help="search engine configurations for violated KV-cache invariants "
                                    "(exit 0: clean, 1: found, 2: usage error)",
                       description=HUNT_DESCRIPTION, epilog=HUNT_WORDS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    hunt_arguments(h)
    h.add_argument("--every-defect", action="store_true",
                   help="hunt the fixed engine, then each historical defect in turn (where the model has its "
                        "mechanism), then the checks upstream's test matrices lacked, one at a time; with --results, "
                        "the measurement results/hunt.json holds (exit 0: clean, and every defect found)")
    h.add_argument("--reintroduce", nargs="+", default=[], choices=tuple(DEFECTS), metavar="NAME",
                   help="run the hunt on an engine with these historical defects switched back on: "
                        + ", ".join(DEFECTS))
    h.set_defaults(func=_cmd_hunt)
    return p


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def describe_error(err: BaseException) -> tuple[int, str]:
    """(exit status, the one line after `minikv: error: `) for an exception a command raised."""
    from minikv.kernels.errors import BAD_INPUT, ENGINE_FAULT, MinikvError
    if isinstance(err, MinikvError):
        status, hint = err.exit_status, err.hint
    elif isinstance(err, (ValueError, TypeError, MemoryError, OSError)):
        status, hint = BAD_INPUT, None
    else:
        return ENGINE_FAULT, (f"internal error, {type(err).__name__}: {_one_line(err)} (a fault in minikv: run again "
                              f"with --traceback and report it)")
    return status, _one_line(err) + (f" (hint: {' '.join(hint.split())})" if hint else "")


def _wants_traceback(argv: list[str]) -> tuple[bool, list[str]]:
    """--traceback anywhere on the command line (taken out before parsing: the subcommands that parse their own
    options never see it), or MINIKV_TRACEBACK=1 in the environment."""
    wanted = os.environ.get("MINIKV_TRACEBACK", "").strip() not in ("", "0")
    if "--traceback" in argv:
        end = argv.index("--") if "--" in argv else len(argv)
        if "--traceback" in argv[:end]:
            wanted = True
            argv = [a for i, a in enumerate(argv) if not (a == "--traceback" and i < end)]
    return wanted, argv


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (0, or 1 for a found defect or failed check). An error exits through
    SystemExit with its status after one line on stderr: `minikv: error: MESSAGE (hint: WHAT TO DO)`."""
    show_traceback, argv = _wants_traceback(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    except Exception as err:  # noqa: BLE001  (every error ends as one line and a documented status)
        status, message = describe_error(err)
        if show_traceback:
            traceback.print_exc()
        sys.stdout.flush()
        parser.exit(status, f"{parser.prog}: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
