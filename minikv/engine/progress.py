"""Warnings held back while a progress bar is on screen, then shown once each, after it.

A warning written while tqdm redraws its bar tears the bar's line, and the same warning from every engine a loop
builds repeats. Inside `held_warnings()`, minikv's log records (WARNING and up) and Python warnings are collected;
when the block ends, each goes out once (a log message repeated with other arguments, such as one per layer,
once with a count), through logging or `warnings` as it would have.
"""
from __future__ import annotations

import contextlib
import logging
import warnings


class _Holder(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_warnings(logger_name: str = "minikv"):
    """Hold the WARNING records of `logger_name` (and its children) and every `warnings.warn` of the block; emit
    each once when the block ends, error or not. It swaps process-wide state (the logger's handlers, the warnings
    filters): use it from one thread, around a command's progress bars."""
    logger = logging.getLogger(logger_name)
    holder, propagate, handlers = _Holder(), logger.propagate, logger.handlers[:]
    logger.handlers[:] = [holder]                       # the logger's own handlers wait too
    logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.handlers[:] = handlers
        logger.propagate = propagate
        # One record per message template: the same warning from every layer or engine of a loop comes once,
        # saying how many more there were.
        by_template: dict = {}
        for record in holder.records:
            by_template.setdefault((record.name, record.levelno, str(record.msg)), []).append(record)
        for records in by_template.values():
            first, more = records[0], len({r.getMessage() for r in records}) - 1
            if more:
                first = logging.makeLogRecord(first.__dict__ | {"msg": f"{first.getMessage()} (and {more} more "
                                                                         f"like it)", "args": None})
            logging.getLogger(first.name).handle(first)
        seen = set()
        for w in caught:
            key = (w.category, str(w.message))
            if key not in seen:
                seen.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
