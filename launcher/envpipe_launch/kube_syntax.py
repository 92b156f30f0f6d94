"""What Kubernetes accepts as names and image references, and how text survives its $(VAR) expansion.

Pure string rules, checked on the client so a bad value is one clear line before any object exists:
- names: DNS labels, RFC 1123 (namespaces) or RFC 1035 (Service names: first character a letter),
  and DNS subdomains (object names such as a Kueue LocalQueue's), as apimachinery's IsDNS1123Label,
  IsDNS1035Label and IsDNS1123Subdomain;
- image references: the grammar of distribution/reference (what container runtimes parse; a pod
  with another image string is created and then stuck in InvalidImageName);
- `$(VAR)` in a container's command, args and env values is expanded by the kubelet and `$$` becomes
  `$`, so text meant literally must have every `$` doubled.
"""

from __future__ import annotations

import re

LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# distribution/reference: [domain[:port]/]path-component[/path-component...][:tag][@digest]
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
NAME_MAX = 255  # the name part (registry and repository), as distribution/reference limits it
REFERENCE_MAX = 1024  # name, tag (128) and a sha512 digest fit; longer text is not even matched


def is_dns1123_label(text: str) -> bool:
    return len(text) <= LABEL_MAX and _DNS1123_LABEL.fullmatch(text) is not None


def is_dns1035_label(text: str, max_len: int = LABEL_MAX) -> bool:
    return len(text) <= max_len and _DNS1035_LABEL.fullmatch(text) is not None


def is_dns1123_subdomain(text: str, max_len: int = 253) -> bool:
    return len(text) <= max_len and _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def is_image_reference(text: str) -> bool:
    m = _REFERENCE.fullmatch(text) if len(text) <= REFERENCE_MAX else None
    return m is not None and len(m.group("name")) <= NAME_MAX


def escape_expansion(text: str) -> str:
    """`text` as the kubelet must see it in a command, arg or env value to pass it on unchanged."""
    return text.replace("$", "$$")
