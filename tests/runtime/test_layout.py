"""The package's import graph has no cycles, and the runtime stands on at most `MAX_FLOORS` floors.

Imports are read from the source (tests/support/import_graph.py): every import statement counts, at the top,
under `if TYPE_CHECKING:` or inside a function.

How floors are counted (as the 2026-11-28 layout review counts them): the runtime's rooms are its top-level
modules (`run`, `rig`, `decision`, `summary`, ...) and its folders (`phases/`, `measure/`, `report/`,
`engine/`), a folder being one room whatever its modules import among themselves. A room that imports no other
room of the runtime is on floor 1; a room is one floor above the highest room it imports. The number of floors is
the number of rooms on the longest import chain (importer first: `entry` -> `run` -> `phases` -> `decision` ->
`measure` -> `summary` is 6 floors). Imports from outside the runtime (envpipe.plan, DeepSpeed) add no floor.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import cycles, longest_chain, module_graph, rooms

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "envpipe.runtime"
MAX_FLOORS = 6


def runtime_room(module: str) -> str:
    """A runtime module's room: its folder, or the module itself at the top."""
    return module.removeprefix(RUNTIME + ".").split(".")[0]


def runtime_rooms() -> dict[str, set[str]]:
    return rooms(module_graph(ROOT / "envpipe"), RUNTIME, runtime_room)


def test_envpipe_has_no_import_cycle() -> None:
    assert cycles(module_graph(ROOT / "envpipe")) == []


def test_the_runtime_modules_have_no_import_cycle() -> None:
    graph = module_graph(ROOT / "envpipe")
    inside = {m: {t for t in ts if t.startswith(RUNTIME + ".")} for m, ts in graph.items()
              if m.startswith(RUNTIME + ".")}
    assert cycles(inside) == []


def test_the_runtime_rooms_have_no_cycle_and_at_most_six_floors() -> None:
    graph = runtime_rooms()
    assert {"phases", "measure", "report", "engine", "run", "decision", "summary"} <= graph.keys()
    assert cycles(graph) == []
    chain = longest_chain(graph)
    assert len(chain) <= MAX_FLOORS, f"{len(chain)} floors: {' -> '.join(chain)}"


# The graph functions on tiny graphs of their own.

def test_a_planted_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]


def test_floors_count_the_rooms_on_the_longest_chain() -> None:
    assert longest_chain({"top": {"mid", "low"}, "mid": {"low"}, "low": set(), "alone": set()}) == ["top", "mid", "low"]
    assert longest_chain({"alone": set()}) == ["alone"]


def test_a_folder_is_one_room(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for path, source in {"__init__.py": "", "top.py": "from pkg.box import inner\n",
                         "box/__init__.py": "", "box/inner.py": "def f():\n    from pkg.box import other\n",
                         "box/other.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.ground\n",
                         "ground.py": "import json\n"}.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(source)
    graph = module_graph(pkg)
    assert graph["pkg.top"] == {"pkg.box.inner"} and graph["pkg.box.inner"] == {"pkg.box.other"}
    assert graph["pkg.box.other"] == {"pkg.ground"}
    collapsed = rooms(graph, "pkg", lambda m: m.removeprefix("pkg.").split(".")[0])
    assert collapsed == {"top": {"box"}, "box": {"ground"}, "ground": set()}
    assert longest_chain(collapsed) == ["top", "box", "ground"]


def test_a_cycle_through_a_type_checking_import_fails_the_test(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n")
    assert cycles(module_graph(pkg)) == [["pkg.a", "pkg.b"]]
