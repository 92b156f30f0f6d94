"""CONTRIBUTING.md's "Public API" table: module -> its public names (tests/docs/test_examples_public.py,
tests/runtime/test_public_api.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROW = re.compile(r"^\| `(envpipe[\w.]*)` \| ([^|]+) \|")
SPAN = re.compile(r"`([^`]+)`")
CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"
Public = dict[str, set[str]]


def public_api(contributing: str | None = None) -> Public:
    """Module -> its public names, from the rows of the "## Public API" section's table (of CONTRIBUTING.md unless
    given its text)."""
    text = CONTRIBUTING.read_text(encoding="utf-8") if contributing is None else contributing
    section = text.split("\n## Public API\n", 1)[1].split("\n## ", 1)[0]
    rows = (ROW.match(line) for line in section.splitlines())
    return {row[1]: set(SPAN.findall(row[2])) for row in rows if row}
