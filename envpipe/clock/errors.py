"""Every refusal the daemon can give, with its HTTP status, in one place (zeusd's shape)."""

from __future__ import annotations


class ClockError(Exception):
    """A refusal with an HTTP status and a stable machine-readable code."""

    status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


class BadRequest(ClockError):
    status, code = 400, "bad_request"


class OutOfRange(ClockError):
    status, code = 422, "out_of_range"


class NotOwned(ClockError):
    status, code = 403, "not_owned"


class NoPermission(ClockError):
    """The driver refused (NVML NoPermission): the daemon lacks the privilege to change clocks."""

    status, code = 403, "no_permission"


class UnknownGpu(ClockError):
    status, code = 404, "unknown_gpu"


class UnknownLease(ClockError):
    status, code = 404, "unknown_lease"


class NoRoute(ClockError):
    """The router's answer: an unknown path (404) or a wrong method (405)."""

    code = "http"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Held(ClockError):
    status, code = 409, "held_by_other_lease"


class AlreadyAttached(ClockError):
    """A lease has one attach stream: a second one is refused (so streams never outnumber leases)."""

    status, code = 409, "already_attached"


class NotSupported(ClockError):
    status, code = 501, "not_supported"


class TooManyRequests(ClockError):
    """Over the caller's request rate, or over its (or everyone's) requests in flight."""

    status, code = 429, "too_many_requests"


class BackendFailure(ClockError):
    status, code = 502, "backend_failure"


class RequestTimeout(ClockError):
    """The request's body did not arrive within the body timeout."""

    status, code = 408, "request_timeout"


class BodyTooLarge(ClockError):
    status, code = 413, "body_too_large"


class UnsupportedMediaType(ClockError):
    """A POST body that is not declared JSON: what a cross-site form or text/plain fetch sends."""

    status, code = 415, "unsupported_media_type"


class ForeignRequest(ClockError):
    """A TCP request with a foreign Host (DNS rebinding) or any Origin (a browser page)."""

    status, code = 403, "foreign_request"


class GpuUnhealthy(ClockError):
    """The GPU's driver missed a deadline or failed a reset; the daemon retries the reset."""

    status, code = 503, "gpu_unhealthy"


class StateUnwritable(ClockError):
    """The leased-clock state file cannot be written, so a lock could outlive a crash unrecorded."""

    status, code = 503, "state_unwritable"


class GpuTimeout(ClockError):
    """A driver call missed its deadline; the GPU is marked unhealthy and its lease ended."""

    status, code = 504, "gpu_timeout"
