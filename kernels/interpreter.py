"""Workarounds that let Triton's interpreter run minikv's kernels correctly and fast on a CPU.
See docs/internals.md#kernels-interpreter."""
from __future__ import annotations

import sys


def _skip_repeated_language_patching() -> None:
    """Make calls between @triton.jit functions cheap in the interpreter."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    if not (hasattr(interp, "_patch_lang") and hasattr(interp, "GridExecutor")) or \
            getattr(interp, "_minikv_patched", False):
        return
    import triton.language as tl
    original_patch, original_launch = interp._patch_lang, interp.GridExecutor.__call__
    launch_state: list[set] = []            # per active launch: the language modules patched so far

    class _Nothing:
        def restore(self):
            pass

    def patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if launch_state and langs and langs <= launch_state[-1]:
            return _Nothing()
        scope = original_patch(fn)
        if launch_state:
            launch_state[-1].update(langs)
        return scope

    def launch(self, *args, **kwargs):
        launch_state.append(set())
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            launch_state.pop()

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch
    interp._minikv_patched = True


def _skip_overflow_checks_that_assert_nothing() -> None:
    """Drop the interpreter's integer-overflow checks, which can never fail."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not hasattr(options, "sanitize_overflow") or options.debug:
        return
    import dataclasses
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _interpret_triton_language() -> None:
    """Redefine triton.language's own @jit helpers (tl.cdiv, tl.max, tl.sum, ...) for the interpreter: defined
    before TRITON_INTERPRET was set, they refuse to be called from an interpreted kernel."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    import triton.language as tl
    interpreted: dict[int, object] = {}

    def swap(namespace, setter) -> None:
        for name, value in list(vars(namespace).items()):
            if isinstance(value, JITFunction):
                setter(name, interpreted.setdefault(id(value), InterpretedFunction(value.fn)))

    for name, module in list(sys.modules.items()):
        if module is not None and (name == "triton.language" or name.startswith("triton.language.")):
            swap(module, lambda n, v, m=module: setattr(m, n, v))
    swap(tl.tensor, lambda n, v: setattr(tl.tensor, n, v))


def adapt(redefine_language: bool) -> None:
    """Apply the workarounds (mode.py calls this once, in interpreter mode)."""
    if redefine_language:
        _interpret_triton_language()
    _skip_repeated_language_patching()
    _skip_overflow_checks_that_assert_nothing()
