"""ssh keys made and read in process (the `cryptography` package), not by running ssh-keygen: the
launcher needs no openssh client on its own machine, and a failure is one Python exception.

Keys are ed25519 in OpenSSH's own formats, the ones sshd and ssh read: the private key as
`-----BEGIN OPENSSH PRIVATE KEY-----` without a passphrase, the public key as one
`ssh-ed25519 AAAA... comment` line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from .errors import LaunchError

COMMENT = "envpipe-launch"
MAX_KEY_BYTES = 64 * 1024  # an RSA-16384 private key is ~12 KiB: anything larger is not a key


@dataclass(frozen=True)
class KeyPair:
    private: str  # OpenSSH private key file text
    public: str  # one authorized_keys line, with a newline


def generate(comment: str = COMMENT) -> KeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return KeyPair(private.decode(), _public_line(key.public_key(), comment))


def _public_line(public: PublicKeyTypes, comment: str) -> str:
    text = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{text.decode()} {comment}\n" if comment else f"{text.decode()}\n"


def write(path: str, comment: str = COMMENT) -> KeyPair:
    """A new key pair at `path` (mode 0600) and `path.pub`, like `ssh-keygen -f path`; never overwrites."""
    pair = generate(comment)
    for file, text, mode in ((path, pair.private, 0o600), (path + ".pub", pair.public, 0o644)):
        try:
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except OSError as e:
            raise LaunchError(f"cannot write ssh key {file}: {e.strerror or e}") from e
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return pair


def public_of(path: str) -> str:
    """The authorized_keys line of the private key at `path` (OpenSSH or PEM format, any type OpenSSH
    uses), like `ssh-keygen -y -f path`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_BYTES + 1)
    except OSError as e:
        raise LaunchError(f"cannot read ssh key {path}: {e.strerror or e}") from e
    if len(data) > MAX_KEY_BYTES:
        raise LaunchError(f"{path} is not an ssh private key (larger than {MAX_KEY_BYTES // 1024} KiB)")
    load = (
        serialization.load_ssh_private_key
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
        else serialization.load_pem_private_key
    )
    try:
        key = load(data, password=None)
    except TypeError as e:  # "Password was not given but private key is encrypted"
        raise LaunchError(f"ssh key {path} is protected by a passphrase: give a key without one") from e
    except (ValueError, UnsupportedAlgorithm) as e:
        raise LaunchError(f"{path} is not an ssh private key that OpenSSH reads: {e}") from e
    try:
        return _public_line(key.public_key(), "")
    except (ValueError, AttributeError) as e:  # e.g. a DH or X25519 key: no ssh public form
        raise LaunchError(f"{path} holds a {type(key).__name__}, not an ssh key type") from e
