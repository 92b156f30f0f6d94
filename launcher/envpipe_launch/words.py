"""Arguments are data: how a word the user gave (the script, its arguments, the working directory, an
--env value) reaches a process on another host as exactly the bytes typed, and one line for a word that
cannot.

Between the launcher and a rank on another host a word meets these parsers, each in its own way:

- DeepSpeed's multi-node runner (deepspeed/launcher/multinode_runner.py, runner.py). Its pdsh runner
  joins one command line for the remote shell, `export K=V; ...; cd CWD; PYTHON -u -m
  deepspeed.launcher.launch ... SCRIPT ARGS`: an argument holding a space goes in double quotes with
  only its `"` escaped (`PDSHRunner.parse_user_args`), every other argument, the script, the
  working directory and its Python go in as they are. An exported value (`add_export`: the lines of
  the env file `DS_ENV_FILE`, read as `KEY=VALUE`, and variables of its own environment) is stripped,
  and put in double quotes when it holds anything but letters, digits and `@%+=:,./-`.
- pdsh replaces `%h`, `%u`, `%n` and `%%` anywhere in the command (src/common/pipecmd.c), and ssh
  hands the command to the remote user's shell, a POSIX shell that parses it once (`$SHELL -c`).
- The MPI launchers (openmpi, mvapich) pass the script and its arguments on as argv, no shell; their
  `-x K=V` / `-env K=V` keep the double quotes add_export put in.
- Kubernetes: the kube backend's node 0 starts the runner from `bash -c` (``posix``), and the kubelet
  expands `$(VAR)` in a container's args and env (kube_syntax.escape_expansion).

So each word is quoted here for the parsers it goes through, innermost first: ``argument`` and
``shell_word`` for the pdsh runner's command line, ``env_file`` for its env file; tests/launch/
test_words.py sends arbitrary bytes through DeepSpeed's own code, a pdsh and a bash and reads them back.
A word no quoting carries (a NUL byte; for an exported value a line break or surrounding white space,
which the env file's reader splits or strips; for the MPI launchers any value DeepSpeed would quote) is
refused with one line before anything starts.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from .errors import LaunchError

PDSH, OPENMPI, MVAPICH = "pdsh", "openmpi", "mvapich"
# add_export leaves a value of these characters as it is (Python's \w: Unicode letters and digits, and _)
_EXPORT_PLAIN = re.compile(r"[\w@%+=:,./-]*")
_DOUBLE_QUOTED_SPECIAL = re.compile(r'([\\$`"])')  # what stays special inside a shell's double quotes
_BUT_THE_QUOTE = re.compile(r"([\\$`])")  # the same, less the `"` that DeepSpeed's parse_user_args escapes
_PDSH_FORMAT = re.compile(r"%[hun%]|%\Z")  # what pdsh replaces (a lone % at the end: it reads past the end)
# DeepSpeed's runner exports the variables of its environment that start with one of these: its own list
# (runner.EXPORT_ENVS, 0.19.8) and the cuda accelerator's (`export_envs()`). Other accelerators add their own
# (npu: ASCEND, HCCL, LD_LIBRARY, PATH; ...), unchecked here: PATH is no value to refuse on a cuda host.
RUNNER_EXPORTS = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")


def check(what: str, word: str) -> str:
    """`word`, unless no process can receive it (a NUL byte ends a C string)."""
    if "\0" in word:
        raise LaunchError(f"{what} {word!r}: holds a NUL byte, which no program can receive as an argument")
    return word


def check_text(what: str, word: str) -> str:
    """`word`, unless a JSON document (a Kubernetes object) cannot hold it: a NUL byte, or bytes that are not
    UTF-8 (Python keeps such bytes of argv as lone surrogates)."""
    check(what, word)
    try:
        word.encode()
    except UnicodeEncodeError as e:
        raise LaunchError(f"{what} {word!r}: not UTF-8 text (at character {e.start}), which a Kubernetes "
                          "object cannot hold") from None
    return word


def posix(word: str) -> str:
    """`word` for a POSIX shell: as it is when plain, else in single quotes (inside, nothing is special)."""
    return shlex.quote(check("argument", word))


def _for_pdsh(text: str) -> str:
    return text.replace("%", "%%")  # pdsh turns %% back into %, and leaves no %h, %u or %n of ours


def shell_word(word: str) -> str:
    """`word` as a word of the pdsh runner's command line that DeepSpeed passes as it is (the script)."""
    return _for_pdsh(posix(word))


def argument(word: str) -> str:
    """`word` as an argument of the script through DeepSpeed's pdsh runner: one without a space as
    ``shell_word``; one with a space DeepSpeed puts in double quotes itself (escaping `"`), so here only
    the other characters special inside double quotes, `\\` `$` and `` ` ``, get their backslash."""
    if " " not in check("argument", word):
        return shell_word(word)
    return _for_pdsh(_BUT_THE_QUOTE.sub(r"\\\1", word))


def value_error(value: str, launcher: str) -> str | None:
    """Why DeepSpeed's `launcher` runner cannot export `value` to the other hosts unchanged, or None."""
    if "\0" in value or "\n" in value or "\r" in value:
        return "holds a line break or NUL byte (DeepSpeed's env file has one KEY=VALUE per line)"
    if value != value.strip():
        return "starts or ends with white space (DeepSpeed strips exported values)"
    if launcher != PDSH and not _EXPORT_PLAIN.fullmatch(value):
        return (f"DeepSpeed's {launcher} runner would pass it in double quotes, which its -x/-env keep: only "
                "letters, digits and @%+=:,./- reach the other hosts unchanged")
    return None


def exported(value: str, launcher: str) -> str:
    """`value` as a line of DeepSpeed's env file writes it, so that its runner exports `value` itself: with
    pdsh, what add_export will put in double quotes gets a backslash before `\\` `$` `` ` `` `"`."""
    if launcher != PDSH:
        return value
    if _EXPORT_PLAIN.fullmatch(value):
        return _for_pdsh(value)
    return _for_pdsh(_DOUBLE_QUOTED_SPECIAL.sub(r"\\\1", value))


def check_env(pairs: Mapping[str, str], launcher: str, where: str = "--env") -> None:
    """Every value reaches the other hosts unchanged through `launcher`'s runner, or one line says which not."""
    for key, value in pairs.items():
        why = value_error(value, launcher)
        if why:
            raise LaunchError(f"{where} {key}={value!r}: {why}")


def env_file(pairs: Mapping[str, str], launcher: str) -> str:
    """DeepSpeed's env file (`KEY=VALUE` lines, none blank: a blank line crashes its reader) for `pairs`,
    each value as ``exported`` writes it (checked first)."""
    check_env(pairs, launcher)
    return "".join(f"{key}={exported(value, launcher)}\n" for key, value in pairs.items())


def runner_exports(environ: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that DeepSpeed's runner exports to the other hosts by itself, less those
    the env file sets again (`given`: its value wins there)."""
    return {k: v for k, v in environ.items() if k.startswith(RUNNER_EXPORTS) and k not in given}


def inherited_error(value: str, launcher: str) -> str | None:
    """Why DeepSpeed's runner cannot export `value` of its own environment unchanged (it writes such a
    value as it is, unlike ``exported``), or None."""
    why = value_error(value, launcher)
    if why is None and launcher == PDSH and (_DOUBLE_QUOTED_SPECIAL.search(value) or _PDSH_FORMAT.search(value)):
        why = "its pdsh runner hands $ ` \\ \" and pdsh's %h %u %n %% to the hosts' shell as they are"
    return why
