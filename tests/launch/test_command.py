"""The DeepSpeed command line per launcher: where the ssh port goes, master_addr always set."""

from __future__ import annotations

import shlex
from pathlib import Path

from envpipe_launch.deepspeed_cmd import deepspeed_argv, ssh_env, write_env_file
from envpipe_launch.job import DEFAULT_MASTER_PORT, JobSpec


def _spec(launcher: str, env: list[str] | None = None) -> JobSpec:
    return JobSpec(nodes=2, gpus_per_node=2, script="t.py", script_args=["--x", "1"], ds_launcher=launcher,
                   env=env or [])


def test_pdsh_gets_ssh_port_and_master_addr() -> None:
    argv = deepspeed_argv(_spec("pdsh"), "/h", "10.0.0.1", python="py")
    assert argv[:4] == ["py", "-u", "-m", "deepspeed.launcher.runner"]
    assert argv[argv.index("--master_addr") + 1] == "10.0.0.1"
    assert argv[argv.index("--ssh_port") + 1] == "2222"
    assert argv[-3:] == ["t.py", "--x", "1"]
    assert "--force_multi" not in argv


def test_hosts_are_reached_over_ssh_even_when_there_is_one() -> None:
    assert "--force_multi" in deepspeed_argv(_spec("pdsh"), "/h", "10.0.0.1", python="py", remote_cwd="/w")


def test_on_remote_hosts_pdsh_ranks_start_through_rank_start() -> None:
    """DeepSpeed's pdsh runner would put its working directory unquoted into the hosts' command line: the
    ranks go back to the launcher's through RANK_START, the script as an argument like the others."""
    argv = deepspeed_argv(_spec("pdsh"), "/h", "10.0.0.1", python="/py", remote_cwd="/w d")
    tail = argv[argv.index("--no_python"):]
    assert tail[:2] == ["--no_python", "--no_local_rank"]
    assert tail[2:5] == ["/py", "-u", "-c"]
    assert tail[6] == "/w d" and tail[-3:] == ["t.py", "--x", "1"]  # words.argument: DeepSpeed quotes "/w d"


def test_master_port_asked_for_free_here_or_the_default() -> None:
    def port(spec: JobSpec, addr: str) -> int:
        argv = deepspeed_argv(spec, "/h", addr, python="py")
        return int(argv[argv.index("--master_port") + 1])

    assert port(JobSpec(1, 1, "t.py", master_port=4242), "127.0.0.1") == 4242
    assert port(_spec("pdsh"), "192.0.2.1") == DEFAULT_MASTER_PORT  # TEST-NET-1: another machine
    assert port(_spec("pdsh"), "127.0.0.1") != DEFAULT_MASTER_PORT  # the kernel's pick, from its ephemeral range


def test_openmpi_port_goes_to_plm_rsh_args() -> None:
    argv = deepspeed_argv(_spec("openmpi"), "/h", "10.0.0.1", python="py", ssh_key="/k")
    assert "--ssh_port" not in argv
    args = shlex.split(argv[argv.index("--launcher_args") + 1])
    assert args[:3] == ["--allow-run-as-root", "--mca", "plm_rsh_args"]
    assert args[3].startswith("-p 2222 ") and args[3].endswith("-i /k")


def test_mvapich_gets_no_openmpi_flags() -> None:
    argv = deepspeed_argv(_spec("mvapich"), "/h", "10.0.0.1", python="py")
    assert "--launcher_args" not in argv and "--ssh_port" not in argv


def test_ssh_env_and_env_file(tmp_path) -> None:
    env = ssh_env("/k")
    assert (
        "-i /k" in env["PDSH_SSH_ARGS_APPEND"] and "StrictHostKeyChecking=no" in env["PDSH_SSH_ARGS_APPEND"]
    )
    write_env_file(str(tmp_path), _spec("pdsh", env=["A=1", "B=x=y"]), env)
    assert (
        Path(env["DS_ENV_FILE"]).read_text() == "A=1\nB=x=y\n"
    )  # no blank lines: DeepSpeed's parser needs that
