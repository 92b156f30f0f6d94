"""Hostile JSON files for fuzzing a loader: a valid document changed the ways a user, a broken tool or an
attacker changes one (a value replaced by one of another type, out of range, huge or empty; a key removed or
added; a list emptied or grown), then its text spoiled (NaN, Infinity, a float that overflows, a 400-digit
integer, nesting 5,000 deep, truncation, a byte-order mark, bytes that are not UTF-8, a NUL), or any bytes at
all. `files(base)` is the hypothesis strategy; a loader must answer each with its document or one line."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st

NASTY: list[Any] = [None, True, False, 0, -1, -5, 1, 2, 99, 1.5, -0.5, 1e-300, 1e300, -1e308, 10**18, 10**17 * 9,
                    "", "x", "0.1", "NaN", "plan file", [], {}, [[]], [0, 0, 0], {"extra": 1}, [[0.1], [0.1, 0.2]]]
TEXT: dict[str, Callable[[bytes], bytes]] = {
    "nan": lambda b: b.replace(b"0.", b"NaN, \"x\": 0.", 1),
    "infinity": lambda b: b.replace(b": 0", b": -Infinity, \"y\": 0", 1),
    "overflow": lambda b: b.replace(b": 1", b": 1e400, \"y\": 1", 1),
    "bigint": lambda b: b.replace(b": 1", b": 1" + b"0" * 400 + b", \"y\": 1", 1),
    "deep": lambda b: b[:-1] + b', "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "truncate": lambda b: b[: len(b) // 2],
    "bom": lambda b: b"\xef\xbb\xbf" + b,
    "latin1": lambda b: b.replace(b'"', b'"\xe9', 1),
    "nul": lambda b: b.replace(b",", b",\x00", 1),
    "list": lambda b: b"[" + b + b"]",
    "empty": lambda b: b"",
}


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in `doc` that holds a value (lists: at most their first 3 entries)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc[:3]) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from paths(value, (*prefix, key))


def changed(base: dict[str, Any], edits: list[tuple[str, int, Any]], spoil: list[str]) -> bytes:
    """`base` with the edits (kind, which place, new value) and the text spoiled, as a file's bytes."""
    doc = copy.deepcopy(base)
    places = list(paths(base))
    for kind, index, value in edits:
        *parents, last = places[index % len(places)]
        node: Any = doc
        with contextlib.suppress(KeyError, IndexError, TypeError):
            for key in parents:
                node = node[key]
            if kind == "set":
                node[last] = copy.deepcopy(value)
            elif kind == "delete":
                del node[last]
            elif kind == "grow" and isinstance(node[last], list):
                node[last] = node[last] * 3 + [copy.deepcopy(value)]
            elif kind == "add" and isinstance(node, dict):
                node[f"unknown_{index % 7}"] = copy.deepcopy(value)
    text = json.dumps(doc).encode()
    for op in spoil:
        text = TEXT[op](text)
    return text


def files(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Mostly changed documents (the ways above), sometimes arbitrary bytes."""
    edit = st.tuples(st.sampled_from(["set", "set", "set", "delete", "grow", "add"]), st.integers(0, 10**6),
                     st.sampled_from(NASTY))
    documents = st.builds(changed, st.just(base), st.lists(edit, min_size=1, max_size=3),
                          st.lists(st.sampled_from(sorted(TEXT)), max_size=1))
    return st.one_of(documents, documents, documents, st.binary(max_size=64))
