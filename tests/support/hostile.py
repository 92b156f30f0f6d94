"""A job whose every word would run shell code, or change on the way, if anything between the launcher and a
rank read it as shell code: a working directory, a script in a sub-folder of it, arguments and --env values
with `$()`, backticks, quotes, spaces, `*`, `$HOME`, newlines, pdsh's `%h`, bytes that are not UTF-8. Its script
records what its rank received (argv, working directory, the values of the variables, PYTHONPATH) in
`out.<RANK>`; `check` compares that with what was typed and looks for the canary file the words would create.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

CANARY = "canary"
RECORDER = """import os, sys
names = sys.argv[-1].split(",")
record = [os.fsencode(a) for a in sys.argv] + [b"--cwd--", os.fsencode(os.getcwd()), b"--env--"]
record += [os.fsencode(os.environ.get(k, "<unset>")) for k in names + ["PYTHONPATH"]]
with open(os.environ["OUT"] + "." + os.environ["RANK"], "wb") as f:
    f.write(b"\\0".join(record))
"""


def words(canary: Path) -> list[str]:
    c = shlex.quote(str(canary))
    return [f"$(touch {c})", f"`touch {c}`", f"; touch {c}", "it's", 'say "hi"', "a b", "*", "$HOME",
            "--lr=$((6*7))", "line1\nline2", "%h %n %u %% %", "\\", "trailing\\", "", " lead", "tab\there",
            "ü €", os.fsdecode(b"\xff\xfe not utf-8"), "-c", "--local_rank=9"]


@dataclass
class HostileJob:
    canary: Path
    cwd: Path  # the launcher's working directory
    script: str  # relative to it
    out: Path  # the recorder writes out.<RANK>
    env: dict[str, str]
    args: list[str]

    @classmethod
    def make(cls, folder: Path) -> HostileJob:
        canary = folder / CANARY
        cwd = folder / f"w $(touch {canary}) `touch {canary}` 'q' \"d\" * $HOME\nnl %h%n%%"
        script = Path("sub dir") / "it's $HOME `x` \"q\".py"
        (cwd / script.parent).mkdir(parents=True)
        (cwd / script).write_text(RECORDER)
        env = {"OUT": str(folder / "out $x 'q'"), "A": f"$(touch {canary})", "B": "x`id`",
               "C": 'say "hi" \\ $HOME %h %%', "D": "50%", "E": "ü €", "DS_ACCELERATOR": "cpu"}
        names = ",".join(k for k in env if k != "OUT")  # the recorder reports these, named by its last argument
        return cls(canary, cwd, str(script), Path(env["OUT"]), env, [*words(canary), names])

    def env_options(self) -> list[str]:
        return [f"--env={k}={v}" for k, v in self.env.items()]

    def utf8_only(self) -> HostileJob:
        """The same job without the arguments that are not UTF-8 (a Kubernetes object is JSON)."""
        args = [a for a in self.args if a.encode(errors="surrogateescape").decode(errors="replace") == a]
        return HostileJob(self.canary, self.cwd, self.script, self.out, self.env, args)

    def check(self, pythonpath: str, local_ranks: tuple[int, ...] = (0,), cwd: Path | None = None,
              script: str | None = None) -> None:
        """Every rank (global rank i has local rank local_ranks[i]) received the words as typed, started in
        `cwd` (the job's) with `pythonpath`; no shell ran any of them."""
        for rank, local in enumerate(local_ranks):
            parts = Path(f"{self.out}.{rank}").read_bytes().split(b"\0")
            at_cwd, at_env = parts.index(b"--cwd--"), parts.index(b"--env--")
            assert [os.fsdecode(p) for p in parts[:at_cwd]] == [script or self.script, f"--local_rank={local}",
                                                                *self.args]
            assert os.fsdecode(parts[at_cwd + 1]) == str(cwd or self.cwd)
            assert [os.fsdecode(p) for p in parts[at_env + 1:]] == [
                *(v for k, v in self.env.items() if k != "OUT"), pythonpath]
        assert not self.canary.exists() and not list(self.canary.parent.rglob(CANARY))
