"""Execute a notebook with nbclient, with its `parameters` cell overridden (papermill's convention).

    python tests/support/notebook_run.py IN.ipynb OUT.ipynb PARAMS.json CWD [TIMEOUT_S]

A code cell that sets every name of PARAMS.json is inserted right after the cell tagged `parameters`
(tagged `injected-parameters`, as papermill does). The executed notebook, with its outputs, is written
to OUT.ipynb also when a cell fails; the exit status is then 1 and the cell's error is printed.
The kernel is the `python3` kernel of this interpreter and inherits this process's environment (and
network namespace: the CML test runs this script inside the namespace of its "session" host).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def with_parameters(nb: Any, params: dict[str, Any]) -> Any:
    index = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(index) != 1:
        raise ValueError(f"the notebook needs exactly one cell tagged 'parameters', it has {len(index)}")
    source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index[0] + 1, cell)
    return nb


def execute(nb_in: str, nb_out: str, params: dict[str, Any], cwd: str, timeout_s: float = 300) -> str | None:
    """Run every cell; returns None, or the failing cell's error text."""
    nb = with_parameters(nbformat.read(nb_in, as_version=4), params)
    client = NotebookClient(nb, timeout=int(timeout_s), kernel_name="python3", resources={"metadata": {"path": cwd}})
    try:
        client.execute()
        return None
    except CellExecutionError as e:
        return str(e)
    finally:
        nbformat.write(nb, nb_out)


def main(argv: list[str]) -> int:
    nb_in, nb_out, params_path, cwd, *rest = argv
    with open(params_path) as f:
        params = json.load(f)
    error = execute(nb_in, nb_out, params, cwd, float(rest[0]) if rest else 300)
    if error is not None:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
