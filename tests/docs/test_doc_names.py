"""What README.md, CONTRIBUTING.md and docs/*.md name exists, and README's figures come from rendered results
(issue #37: README and docs named a `runner.py` and a `Runner` long gone, and quoted figures no results file
held).

What a doc names, outside its fenced blocks (tests/docs/test_docs_commands.py runs the shell ones):
- a link to a file of this repository, or an inline path under one of its top-level folders
  (`envpipe/runtime/run.py`), must exist; `tests/support/fakes/kube_controllers.pod_for_index` names a module
  file and a name it defines;
- a bare Python file name (`run.py`) must be a file of this repository; DeepSpeed's files are named by their
  path in its package (`deepspeed/launcher/launch.py`), which must exist there;
- a dotted name under the project's packages (`envpipe.plan.optimal.orders.optimal_plan`, `envpipe_launch.supervise`)
  must be a module, a name a module defines, a key of the `envpipe` config block written the way runtime.md
  writes them (`envpipe.straggler_threshold`), or a string the code uses by that name (a logger's);
- a name in CamelCase (`EnvPipeRun`, `RunSummary`) must be a class, function or constant of this repository, a
  class of DeepSpeed or torch, a Python builtin, or a term of the systems the docs describe (EXTERNAL below).
Modules are read, not imported: nothing heavy loads, nothing runs.

README's figures: every paragraph and table row of README.md that states a figure (a percentage, a ratio
like 1.0004) links a results file that `benchmarks/rendered.py` renders from committed raw files, and that
file holds each of those figures as written.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import rendered
from envpipe.runtime.config import EnvPipeConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"(?ms)^ *(```+|~~~+).*?^ *\1")
CAMEL = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")
DOTTED = re.compile(r"(envpipe|envpipe_launch|benchmarks|tests)(\.[A-Za-z_]\w*)+(\(\))?")
PACKAGES = {"envpipe": ROOT / "envpipe", "envpipe_launch": ROOT / "launcher" / "envpipe_launch",
            "benchmarks": ROOT / "benchmarks", "tests": ROOT / "tests"}
# Terms of the systems the docs describe, which no Python here defines: Kubernetes (pod states, reasons,
# conditions, field values), OpenSSH's sshd_config, NVML's C API, JSON's non-numbers.
EXTERNAL = {
    "CrashLoopBackOff", "CreateContainerConfigError", "DirectoryOrCreate", "DisruptionTarget", "ErrImagePull",
    "FailedCreate", "ImagePullBackOff", "RuntimeDefault",  # Kubernetes
    "PermitUserEnvironment",  # OpenSSH
    "ResetGpuLockedClocks", "SetGpuLockedClocks",  # NVML
    "Infinity", "NaN",  # JSON
}
# A figure: a percentage (its sign, if written, included), or a ratio with four decimals (1.0004).
FIGURE = re.compile(r"[+\-−]?\d+(?:\.\d+)? ?%|(?<![\d.])\d\.\d{4}(?![\d.])")


def prose(path: Path) -> str:
    """A doc without its fenced blocks."""
    return FENCED.sub("", path.read_text(encoding="utf-8"))


@functools.cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return tuple(p for p in out.splitlines() if (ROOT / p).exists())


@functools.cache
def deepspeed_package() -> Path:
    spec = importlib.util.find_spec("deepspeed")
    assert spec is not None and spec.origin is not None, "DeepSpeed is installed with envpipe[train]"
    return Path(spec.origin).parent


@functools.cache
def deepspeed_files() -> tuple[Path, ...]:
    return tuple(deepspeed_package().rglob("*.py"))


@functools.cache
def module_names(path: Path) -> frozenset[str]:
    """What a module file defines at any depth (classes, functions, assigned names), what it imports, and the
    names its module-level __getattr__ (or __all__) serves."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
            if node.name == "__getattr__":
                names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}  # served lazily
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


@functools.cache
def defined_here() -> frozenset[str]:
    return frozenset(n for p in tracked() if p.endswith(".py") for n in module_names(ROOT / p))


@functools.cache
def string_constants() -> frozenset[str]:
    return frozenset(c.value for p in tracked() if p.endswith(".py")
                     for c in ast.walk(ast.parse((ROOT / p).read_text(encoding="utf-8")))
                     if isinstance(c, ast.Constant) and isinstance(c.value, str))


@functools.cache
def external_classes() -> frozenset[str]:
    """Classes of DeepSpeed (by its source) and of torch.nn, and Python's builtins."""
    found = {m for f in deepspeed_files() for m in re.findall(r"^class (\w+)", f.read_text(errors="replace"), re.M)}
    import torch.nn

    return frozenset(found | set(dir(torch.nn)) | set(dir(builtins)))


def module_file(dotted: str) -> Path | None:
    """The file of a module of the project's packages, or None."""
    head, *rest = dotted.split(".")
    base = PACKAGES[head].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_problem(name: str) -> str | None:
    parts = name.removesuffix("()").split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:i]))
        if path is None:
            continue
        rest = parts[i:]
        if not rest or rest[0] in module_names(path):
            return None  # a module, or a name it defines (deeper attributes: its class's, not checked)
        break
    if parts[0] == "envpipe" and len(parts) == 2 and parts[1] in EnvPipeConfig.model_fields:
        return None  # the `envpipe` config block's key
    if name in string_constants():
        return None  # a name the code uses as a string: a logger's
    return f"`{name}`: no such module or name"


def path_problem(doc: Path, token: str) -> str | None:
    if (ROOT / token).exists():
        return None
    module, _, attr = token.rpartition(".")
    if module and (ROOT / f"{module}.py").is_file() and attr in module_names(ROOT / f"{module}.py"):
        return None  # a module file and a name it defines
    return f"`{token}`: no such file"


def names_in(doc: Path, text: str | None = None) -> list[str]:
    """What is wrong with the names `doc` gives (or ``text``, as if it were `doc`'s), one line each."""
    text = FENCED.sub("", text) if text is not None else prose(doc)
    top = {p.split("/")[0] for p in tracked()}
    files = {Path(p).name for p in tracked()}
    problems: list[str] = []
    for target in LINK.findall(text):
        if not target.startswith(("http://", "https://", "mailto:", "#")) and \
                not (doc.parent / target.split("#")[0]).exists():
            problems.append(f"link {target}: no such file")
    for span in (s.strip() for s in SPAN.findall(text)):
        if CAMEL.fullmatch(span) and span not in defined_here() | external_classes() | EXTERNAL:
            problems.append(f"`{span}`: defined nowhere here (nor in DeepSpeed, torch or Python)")
        elif DOTTED.fullmatch(span):
            problems.append(dotted_problem(span) or "")
        elif re.fullmatch(r"[\w.-]+\.py", span) and span not in files:
            problems.append(f"`{span}`: no file of this name here")
        for token in span.split():
            token = token.strip(",;:()'\"")
            if "/" in token and token.split("/")[0] in top and not re.search(r"[*<>{}$]", token):
                problems.append(path_problem(doc, token.rstrip("/")) or "")
            elif token.startswith("deepspeed/") and not (deepspeed_package().parent / token).exists():
                problems.append(f"`{token}`: no such file in DeepSpeed's package")
    return [f"{doc.relative_to(ROOT)}: {p}" for p in problems if p]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_what_the_docs_name_exists(doc: Path) -> None:
    problems = names_in(doc)
    assert not problems, "\n".join(problems)


def blocks(text: str) -> list[str]:
    """README's paragraphs and table rows: what a figure and the link that backs it must share."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        rows = para.splitlines()
        out += rows if rows and all(r.lstrip().startswith("|") for r in rows) else [para]
    return out


def holds(results: str, figure: str) -> bool:
    """Whether a results file states ``figure`` ("+10.7 %", "1.0004"): the same number, with the same sign if one
    is written (a space before % and the minus sign's form aside)."""
    number = figure.replace("−", "-").replace(" ", "")
    signed = number[0] in "+-"
    pattern = ("" if signed else r"[+\-]?") + re.escape(number).replace("%", " ?%")
    return re.search(rf"(?<![\d.]){pattern}(?![\d])", results.replace("−", "-")) is not None


def figure_problems(text: str) -> list[str]:
    renders = {r.name: (rendered.RESULTS / r.name).read_text(encoding="utf-8") for r in rendered.RENDERED}
    problems = []
    for block in blocks(FENCED.sub("", text)):
        figures = FIGURE.findall(block)
        if not figures:
            continue
        cited = [renders[Path(t).name] for t in LINK.findall(block) if Path(t).name in renders
                 and "benchmarks/results/" in t]
        missing = [f for f in figures if not any(holds(r, f) for r in cited)]
        if not cited:
            problems.append(f"figures {', '.join(figures)} cite no rendered results file: {block[:120]!r}")
        elif missing:
            problems.append(f"figures {', '.join(missing)} are in none of the cited results files: {block[:120]!r}")
    return problems


def test_readmes_figures_are_the_rendered_results() -> None:
    problems = figure_problems((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_the_issue_found() -> None:
    """README's names before issue #37 fail the names check; a figure no rendered file backs fails the other."""
    stale = ("the phases (`runner.py`) and the `Runner`; `envpipe.runtime.runner.Runner`;\n"
             "[the results](benchmarks/results/nothing.md) and `envpipe/runtime/runner.py`\n")
    got = " ".join(names_in(ROOT / "README.md", stale))
    for wanted in ("`runner.py`", "`Runner`", "`envpipe.runtime.runner.Runner`", "link benchmarks/results/nothing.md",
                   "`envpipe/runtime/runner.py`"):
        assert wanted in got, wanted
    cite = "([dropin_h100x2.md](benchmarks/results/dropin_h100x2.md))"
    assert figure_problems(f"2.3 % slower {cite}") == []  # as that file has it: +2.3%
    assert figure_problems(f"12.5 % saved {cite}")  # a figure that file does not hold
    assert figure_problems(f"-132.9 % {cite}")  # nor with that sign (it has +132.9%)
    assert figure_problems("a 1.0004 ratio, cited nowhere")
    assert figure_problems("15.5 % ([planner.md](benchmarks/results/planner.md)): written, not rendered")
