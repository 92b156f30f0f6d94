"""The daemon's log lines: one line per record, whatever a request put into it, and never a flood.

Whatever comes from a request (a path, a header, a message that quotes either) enters the log only as a
field of a JSON event (``event``: ASCII-only JSON, so a newline or any control character is escaped), and
the formatter escapes control characters in everything else that reaches it, tracebacks included. So no
input starts a line of its own or forges an audit record. Lines a caller can provoke at will (refusals,
requests that are not HTTP) are throttled per caller (``Throttle``): one line a second, which says how
many it stands for.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Any

log = logging.getLogger("envpipe.clockd")
audit = logging.getLogger("envpipe.clockd.audit")

# C0 controls but tab, DEL, and the line breaks that some readers honour (NEL, LS, PS)
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0, 9), *range(11, 32), 0x7F)}
_ESCAPES |= {10: "\\n", 13: "\\r", 0x85: "\\x85", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def event(name: str, **fields: Any) -> str:
    """A structured log message: ``{"event": name, ...fields}``, escaped for one line."""
    return json.dumps({"event": name, **fields}, ensure_ascii=True, default=str)


def one_line(text: str) -> str:
    return text.translate(_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """The daemon's formatter: every record is exactly one line."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


def configure(level: str) -> None:
    """Log to stderr, one line per record: ``<time> <logger> <LEVEL> <message>``."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


class Throttle:
    """At most one line per key per ``interval_s``; ``pass_`` answers how many lines the key's previous
    interval held back (to say in the line), or None to hold this one back too."""

    def __init__(self, interval_s: float = 1.0, max_keys: int = 10_000) -> None:
        self.interval_s, self.max_keys = interval_s, max_keys
        self._keys: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def pass_(self, key: str) -> int | None:
        now = time.monotonic()
        since, held = self._keys.pop(key, (-self.interval_s, 0))
        if now - since < self.interval_s:
            self._keys[key] = (since, held + 1)
            return None
        if len(self._keys) >= self.max_keys:  # forget the quietest key, not everyone
            self._keys.popitem(last=False)
        self._keys[key] = (now, 0)
        return held
