"""The decode kernel stays readable: its body at most 80 lines and at most 25 parameters, each format's decoding in
a named @triton.jit helper of its own."""
from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "decode_attention.py"


def _functions() -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in ast.parse(SOURCE.read_text()).body if isinstance(f, ast.FunctionDef)}


def test_the_kernel_body_is_short_and_takes_few_parameters():
    kernel = _functions()["_decode_kernel"]
    body = kernel.body[1:] if isinstance(kernel.body[0], ast.Expr) else kernel.body     # past the docstring
    assert len(kernel.args.args) <= 25
    assert body[-1].end_lineno - body[0].lineno + 1 <= 80


def test_each_decoding_is_a_named_jit_helper():
    functions = _functions()
    for name in ("_int8_to_f16", "_e4m3_to_f16", "_codes_to", "_window_codes_to", "pow2_row_scale", "_qk", "_pv",
                 "_dot_operands", "_load_q", "_store_rows"):
        decorators = [ast.unparse(d) for d in functions[name].decorator_list]
        assert any(d.startswith("triton.jit") for d in decorators), name
    called = {n.func.id for n in ast.walk(functions["_decode_kernel"]) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    assert {"_qk", "_pv", "_token_scales", "_dot_operands", "_load_q", "_store_rows"} <= called
