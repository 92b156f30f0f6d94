"""`envpipe.runtime`'s public names: each resolves, the CONTRIBUTING.md table lists exactly them, and importing
the package (or a config name, as the example's --help does) loads neither torch nor DeepSpeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import envpipe.runtime
from tests.support.public_api import public_api

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves() -> None:
    for name in envpipe.runtime.__all__:
        assert getattr(envpipe.runtime, name) is not None, name


def test_the_contributing_table_lists_the_runtime_s_all() -> None:
    assert public_api()["envpipe.runtime"] == set(envpipe.runtime.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'settings'"):
        envpipe.runtime.settings  # noqa: B018  (the old name: gone)


def test_the_package_and_its_config_names_load_nothing_heavy() -> None:
    code = ("import sys; from envpipe.runtime import CALIBRATION_LEAST, ClockKind, EnvPipeConfig; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
