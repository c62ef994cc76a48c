"""The check cells of the notebooks' exercises: compare a learner's answer with the one the engine computed.
See docs/internals.md#viz-exercises."""
from __future__ import annotations

import math
from collections.abc import Callable

NO_ANSWER = "no answer yet: put yours in the cell above (replace None), run it, then run this cell again"


def _close(answer, expected, rel: float, abs_: float) -> bool:
    try:
        return math.isclose(float(answer), float(expected), rel_tol=rel, abs_tol=abs_)
    except (TypeError, ValueError):
        return False


def check(name: str, answer, expected, *, rel: float | None = None, abs_tol: float = 0.0,
          same: Callable[[object, object], bool] | None = None) -> bool | None:
    """Print whether `answer` matches `expected` and return True/False (None while the answer is still
    None)."""
    if answer is None:
        print(f"{name}: {NO_ANSWER}.")
        return None
    if same is not None:
        ok = bool(same(answer, expected))
    elif rel is not None or abs_tol:
        ok = _close(answer, expected, rel or 0.0, abs_tol)
    elif isinstance(expected, (list, tuple)) and isinstance(answer, (list, tuple)):
        ok = list(answer) == list(expected)
    elif isinstance(expected, (set, frozenset)) and isinstance(answer, (list, tuple, set, frozenset)):
        ok = set(answer) == set(expected)
    else:
        ok = answer == expected
    if ok:
        print(f"{name}: right.")
    else:
        print(f"{name}: not quite (your answer: {answer!r}). Think it through again, or unfold the solution below.")
    return ok
