"""The examples import only the public API: `envpipe` and the modules and names of CONTRIBUTING.md's "Public API"
table (issue #39: examples/train_gpt.py imported the runtime's private modules). The table is read here, so the
doc and the test cannot drift (tests/support/public_api.py reads it). Examples are read, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.public_api import Public, public_api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def dotted(node: ast.expr) -> str | None:
    """`envpipe.runtime.read_config` for that attribute chain; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def allowed(name: str, public: Public) -> bool:
    """A public module, or a public name of one (`envpipe.runtime.read_config`)."""
    module, _, attr = name.rpartition(".")
    return name in public or attr in public.get(module, set())


def private_imports(source: str, public: Public) -> list[str]:
    """What a script's source uses of `envpipe` beyond the public API: modules it imports, names it imports or
    reads as attributes of an imported module."""
    tree = ast.parse(source)
    bad: list[str] = []
    imported: set[str] = set()  # local names bound to envpipe modules by `import envpipe[.x]`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "envpipe":
                    imported.add(alias.asname or alias.name.split(".")[0])
                    if alias.name not in public:
                        bad.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "envpipe":
            bad.extend(f"{node.module}.{alias.name}" for alias in node.names
                       if not allowed(f"{node.module}.{alias.name}", public))
    for node in ast.walk(tree):
        name = dotted(node) if isinstance(node, ast.Attribute) else None
        if name is not None and name.split(".")[0] in imported and not allowed(name, public):
            bad.append(name)
    return sorted(set(bad))


@pytest.fixture(scope="module")
def public() -> Public:
    return public_api()


def test_the_table_names_the_package_and_the_runtime(public: Public) -> None:
    assert public["envpipe"] == {"initialize", "__version__"}
    assert "envpipe.runtime" in public and len(public) >= 3


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_imports_only_the_public_api(example: Path, public: Public) -> None:
    assert private_imports(example.read_text(encoding="utf-8"), public) == []


def test_a_planted_private_import_is_found(public: Public) -> None:
    source = """
import envpipe
import envpipe.runtime.entry
from envpipe.runtime import read_config, distributed
from envpipe.runtime.report.text import render_report
from envpipe.limits import MAX_MICROBATCHES
import os.path

def main():
    from envpipe.plan.planfile import Plan
    envpipe.initialize()
    envpipe.quiet.native_output_silenced()
    return os.path.join(envpipe.__version__)
"""
    assert private_imports(source, public) == [
        "envpipe.plan.planfile.Plan", "envpipe.quiet", "envpipe.quiet.native_output_silenced",
        "envpipe.runtime.distributed", "envpipe.runtime.entry", "envpipe.runtime.report.text.render_report",
    ]
