"""Job keys made in process: the formats OpenSSH reads, checked with OpenSSH's own ssh-keygen where it is
installed (the real sshd login with such keys runs in test_cml.py and test_notebook_cml.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from envpipe_launch import sshkeys
from envpipe_launch.errors import LaunchError

SSH_KEYGEN = shutil.which("ssh-keygen")


def test_generated_pair_is_an_openssh_ed25519_key() -> None:
    pair = sshkeys.generate()
    assert pair.private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert pair.public.startswith("ssh-ed25519 ") and pair.public.endswith(" envpipe-launch\n")
    key = serialization.load_ssh_private_key(pair.private.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert pair.public.split()[:2] == public.decode().split()
    assert sshkeys.generate().private != pair.private  # fresh per job


def test_write_makes_private_0600_and_never_overwrites(tmp_path: Path) -> None:
    path = str(tmp_path / "id")
    pair = sshkeys.write(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert Path(path + ".pub").read_text() == pair.public
    assert sshkeys.public_of(path).split() == pair.public.split()[:2]
    with pytest.raises(LaunchError, match=r"cannot write ssh key .*/id: File exists"):
        sshkeys.write(path)
    assert Path(path).read_text() == pair.private


@pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen not installed (run .ci/apt-deps)")
def test_openssh_reads_what_we_write_and_we_read_what_it_writes(tmp_path: Path) -> None:
    ours = str(tmp_path / "ours")
    pair = sshkeys.write(ours)
    derived = subprocess.run([SSH_KEYGEN, "-y", "-f", ours], capture_output=True, text=True, check=True).stdout
    assert derived.split()[:2] == pair.public.split()[:2]
    for kind in ("ed25519", "rsa", "ecdsa"):
        theirs = str(tmp_path / kind)
        subprocess.run([SSH_KEYGEN, "-q", "-t", kind, "-N", "", "-f", theirs], check=True)
        assert sshkeys.public_of(theirs).split() == Path(theirs + ".pub").read_text().split()[:2]
    locked = str(tmp_path / "locked")
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "secret", "-f", locked], check=True)
    with pytest.raises(LaunchError, match="is protected by a passphrase"):
        sshkeys.public_of(locked)


@pytest.mark.parametrize("kind", ["rsa-pem", "ec-pem"])
def test_pem_private_keys_are_read_too(tmp_path: Path, kind: str) -> None:
    key = rsa.generate_private_key(65537, 2048) if kind == "rsa-pem" else ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / kind
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    expected = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert sshkeys.public_of(str(path)) == expected.decode() + "\n"


def test_bad_keys_are_one_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    junk = tmp_path / "junk"
    junk.write_text("not a key\n")
    huge = tmp_path / "huge"
    huge.write_bytes(b"x" * (sshkeys.MAX_KEY_BYTES + 1))
    cases = [
        (locked, "is protected by a passphrase"),
        (junk, "is not an ssh private key that OpenSSH reads"),
        (huge, r"is not an ssh private key \(larger than 64 KiB\)"),
        (tmp_path / "missing", "cannot read ssh key .*: No such file or directory"),
    ]
    for path, message in cases:
        with pytest.raises(LaunchError, match=message):
            sshkeys.public_of(str(path))
