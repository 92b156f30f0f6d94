"""The clockd HTTP API as both sides see it: where the daemon listens, its paths, and its request bodies
and headers, parsed strictly: wrong types, unknown fields, deep nesting and numbers that are not finite
are refused.

Bodies are three small objects, parsed by hand rather than by pydantic: the daemon's image installs only
the `sidecar` extra, and these parsers answer every bad input with one 400 line that names the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from envpipe.clock.errors import BadRequest
from envpipe.clock.ownership import PodRef

# The daemon's socket in envpipe: the client's default, the daemon's --socket default. The launcher cannot
# import envpipe; its copy is launcher/envpipe_launch/pod_contract.ClockdSocket, and
# tests/deploy/test_pod_contract.py checks that the two and the chart's values agree.
DEFAULT_SOCKET = "/run/envpipe/clockd.sock"
SOCKET_ENV = "ENVPIPE_CLOCKD_SOCKET"  # where a client finds the socket when it is not the default

API = "/v1"
# Paths, in aiohttp's route syntax; `path()` fills them in for clients.
GPUS = API + "/gpus"
GPU = GPUS + "/{uuid}"
LOCK = GPU + "/lock"
RESET = GPU + "/reset"
LEASES = API + "/leases"
LEASE = LEASES + "/{lease}"
RENEW = LEASE + "/renew"
ATTACH = LEASE + "/attach"

MAX_BODY_BYTES = 16 * 1024
MAX_GPUS_PER_LEASE = 64
MAX_DEPTH = 4  # the deepest body is {"pod": {...}}: 2
POD_HEADER = "X-Envpipe-Pod"  # "namespace/name": who a caller says it is (audit lines)
# Kubernetes names: a DNS-1123 label (namespace) and subdomain (pod)
_NAMESPACE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_POD_NAME = r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?"
_POD_CLAIM = re.compile(f"{_NAMESPACE}/{_POD_NAME}")
_OPEN, _CLOSE, _QUOTE, _BACKSLASH = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")


def path(template: str, **parts: str) -> str:
    """A path of the API with its parts filled in, each quoted as one path segment."""
    return template.format(**{name: quote(value, safe="") for name, value in parts.items()})


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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")  # json.loads takes NaN and Infinity otherwise


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is too large for a number")
    return value


def _object(raw: bytes, allowed: set[str], required: set[str]) -> dict[str, Any]:
    _check_depth(raw)
    try:
        body = json.loads(raw or b"{}", parse_constant=_no_constant, parse_float=_finite)
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
        raise BadRequest(f"{key!r} must be an integer number of MHz in (0, 100000), got {str(value)[:20]}")
    return value


def _seconds(body: dict[str, Any], key: str) -> float | None:
    """A number of seconds, finite; its range is the service's to check (422)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key!r} must be a number of seconds, got {str(value)[:20]}")
    try:
        return float(value)  # an integer of 400 digits does not fit
    except OverflowError:
        raise BadRequest(f"{key!r} must be a finite number of seconds, got a {len(str(value))}-digit integer") from None


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
        pod = None
        if "pod" in body:
            if not isinstance(body["pod"], dict):
                raise BadRequest('\'pod\' must be an object {"namespace": ..., "name": ...}')
            p = _object(json.dumps(body["pod"]).encode(), {"namespace", "name"}, {"namespace", "name"})
            pod = PodRef(_str(p, "namespace"), _str(p, "name"))
            if not re.fullmatch(_NAMESPACE, pod.namespace) or not re.fullmatch(_POD_NAME, pod.name):
                raise BadRequest(f"'pod' must name a Kubernetes pod (DNS-1123 names), got {str(pod)[:80]!r}")
        return cls(gpus, _seconds(body, "ttl_s"), pod)


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
