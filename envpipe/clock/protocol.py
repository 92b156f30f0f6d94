"""Request bodies and headers of the clockd HTTP API, parsed strictly: wrong types, unknown fields and
deep nesting are refused."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from envpipe.clock.errors import BadRequest
from envpipe.clock.ownership import PodRef

API = "/v1"
MAX_BODY_BYTES = 16 * 1024
MAX_GPUS_PER_LEASE = 64
MAX_DEPTH = 4  # the deepest body is {"pod": {...}}: 2
POD_HEADER = "X-Envpipe-Pod"  # "namespace/name": who a caller says it is (rate limits, audit)
# Kubernetes names: a DNS-1123 label (namespace) and subdomain (pod)
_POD_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")
_OPEN, _CLOSE, _QUOTE, _BACKSLASH = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")


def _check_depth(raw: bytes) -> None:
    """Refuse nesting deeper than MAX_DEPTH before the parser recurses into it."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > MAX_DEPTH:
                raise BadRequest(f"body is nested deeper than {MAX_DEPTH} levels")
        elif byte in _CLOSE:
            depth -= 1


def pod_claim(value: str | None) -> str | None:
    """The pod a caller names in the X-Envpipe-Pod header (a claim, not a proof)."""
    if value is None:
        return None
    if not _POD_CLAIM.fullmatch(value):
        raise BadRequest(f"{POD_HEADER} must be 'namespace/name' of a Kubernetes pod, got {value[:80]!r}")
    return value


def _object(raw: bytes, allowed: set[str], required: set[str]) -> dict[str, Any]:
    _check_depth(raw)
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(body))
    if missing:
        raise BadRequest(f"missing field(s) {missing}")
    return body


def _str(body: dict[str, Any], key: str, max_len: int = 256) -> str:
    value = body[key]
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise BadRequest(f"{key!r} must be a non-empty string of at most {max_len} characters")
    return value


def _int(body: dict[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 100_000:
        raise BadRequest(f"{key!r} must be an integer number of MHz in (0, 100000), got {value!r}")
    return value


@dataclass(frozen=True)
class OpenLease:
    gpus: list[str]
    ttl_s: float | None
    pod: PodRef | None

    @classmethod
    def parse(cls, raw: bytes) -> OpenLease:
        body = _object(raw, {"gpus", "ttl_s", "pod"}, {"gpus"})
        gpus = body["gpus"]
        if (
            not isinstance(gpus, list)
            or not 0 < len(gpus) <= MAX_GPUS_PER_LEASE
            or not all(isinstance(g, str) and 0 < len(g) <= 128 for g in gpus)
        ):
            raise BadRequest(f"'gpus' must be a list of 1 to {MAX_GPUS_PER_LEASE} GPU UUID strings")
        ttl = body.get("ttl_s")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise BadRequest(f"'ttl_s' must be a number of seconds, got {ttl!r}")
        pod = None
        if "pod" in body:
            if not isinstance(body["pod"], dict):
                raise BadRequest('\'pod\' must be an object {"namespace": ..., "name": ...}')
            p = _object(json.dumps(body["pod"]).encode(), {"namespace", "name"}, {"namespace", "name"})
            pod = PodRef(_str(p, "namespace"), _str(p, "name"))
        return cls(gpus, None if ttl is None else float(ttl), pod)


@dataclass(frozen=True)
class Lock:
    lease: str
    mhz: int

    @classmethod
    def parse(cls, raw: bytes) -> Lock:
        body = _object(raw, {"lease", "mhz"}, {"lease", "mhz"})
        return cls(_str(body, "lease"), _int(body, "mhz"))


@dataclass(frozen=True)
class Reset:
    lease: str

    @classmethod
    def parse(cls, raw: bytes) -> Reset:
        return cls(_str(_object(raw, {"lease"}, {"lease"}), "lease"))
