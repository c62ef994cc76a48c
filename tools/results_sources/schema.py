"""What every results source is turned into, {"name", "command", "quantities", "tables"}, the check of that
shape, and the small formatting helpers the sources share."""
from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIRED_KEYS = ("name", "command", "quantities", "tables")


class ResultsError(ValueError):
    """A results source or a results block that cannot be used; the message says what to fix."""


def check_shape(data: dict, where: str, stem: str) -> dict:
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ResultsError(f"{where}: missing key(s) {missing}; a results file needs {list(REQUIRED_KEYS)}")
    if data["name"] != stem:
        raise ResultsError(f"{where}: \"name\" is {data['name']!r} but the file stem is {stem!r}; "
                           "they must be the same")
    for q, entry in data["quantities"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("display"), str):
            raise ResultsError(f"{where}: quantity {q!r} needs a \"display\" string")
    for t, table in data["tables"].items():
        if not isinstance(table, dict) or not {"columns", "rows"} <= set(table):
            raise ResultsError(f"{where}: table {t!r} needs \"columns\" and \"rows\"")
        bad = [i for i, row in enumerate(table["rows"]) if len(row) != len(table["columns"])]
        if bad:
            raise ResultsError(f"{where}: table {t!r}: row(s) {bad} do not have {len(table['columns'])} cells")
    return data


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e}); re-run the command that writes it") from e



def slug(text: str) -> str:
    """`text` as a quantity key: runs of anything but letters and digits become one underscore."""
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_")


def cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, "g")
    return str(value).replace("|", "\\|").replace("\n", " ")
