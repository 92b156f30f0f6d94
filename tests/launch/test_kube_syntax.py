"""Kubernetes names, image references and $(VAR) escaping (envpipe_launch.kube_syntax), and the escaping
where the kube backend builds its pods' commands and env values."""

from __future__ import annotations

import shlex

import pytest
from envpipe_launch import kube_syntax, words
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import KubeJob
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fakes.kubelet import kubelet_expand

DIGEST = "sha256:" + "a" * 64


def test_the_model_expands_like_the_kubelet() -> None:
    env = {"HOME": "/root", "X": "1"}
    assert kubelet_expand("$(HOME)/a $(NOPE) $$(HOME) $$$(X) $x $( $", env) == "/root/a $(NOPE) $(HOME) $1 $x $( $"


@settings(max_examples=500, derandomize=True, database=None)
@given(st.text(alphabet="$()ab\\\"' HOME"), st.dictionaries(st.sampled_from(["HOME", "a", "b", ""]), st.text()))
def test_escaped_text_reaches_the_container_unchanged(text: str, env: dict[str, str]) -> None:
    assert kubelet_expand(kube_syntax.escape_expansion(text), env) == text


def test_pods_run_script_args_and_env_values_as_given() -> None:
    args = ["--msg", "$(HOSTNAME) costs $$5", "--path", "$(ENVPIPE_CLOCKD_SOCKET)"]
    spec = JobSpec(nodes=2, gpus_per_node=1, script="train.py", script_args=args, backend="kube",
                   env=["GREETING=$(HOSTNAME)"], script_on_workers=True)
    no_ssh, ssh = KubeJob(spec, "j", "default", "img:1", no_ssh=True), KubeJob(spec, "j", "default", "img:1")
    for job in (no_ssh, ssh):
        (container,) = job.pod_template()["spec"]["containers"]
        env = {e["name"]: kubelet_expand(e["value"], {}) for e in container["env"] if "value" in e}
        # no_ssh: the node's env is the job's; ssh: DeepSpeed's env file (no kubelet expansion there)
        assert env.get("GREETING", "$(HOSTNAME)") == "$(HOSTNAME)"
        argv = [kubelet_expand(part, {**env, "HOSTNAME": "pod-0"}) for part in container["args"]]
        # with ssh, what DeepSpeed's runner gets is quoted again for its pdsh command line (tests/launch/
        # test_words.py follows it through DeepSpeed, pdsh and the hosts' shell)
        program = ["train.py", *args] if job.no_ssh else [words.shell_word("train.py"), *map(words.argument, args)]
        assert argv[1:3] == ["bash", "-c"] and shlex.split(argv[3])[-5:] == program
    no_ssh_env = no_ssh.pod_template()["spec"]["containers"][0]["env"]
    assert no_ssh_env[-1] == {"name": "GREETING", "value": "$$(HOSTNAME)"}
    assert ssh.config_map()["data"]["deepspeed_env"] == "GREETING=\\$(HOSTNAME)\n"  # DeepSpeed double-quotes it


@pytest.mark.parametrize("name", ["a", "envpipe-1a2b3c", "a" * 63, "0abc", "a-b-c"])
def test_dns1123_labels(name: str) -> None:
    assert kube_syntax.is_dns1123_label(name)


@pytest.mark.parametrize("name", ["", "Bad NS", "My_Job", "a" * 64, "-a", "a-", "a.b", "ä"])
def test_not_dns1123_labels(name: str) -> None:
    assert not kube_syntax.is_dns1123_label(name)


def test_dns1035_labels_start_with_a_letter() -> None:
    assert kube_syntax.is_dns1035_label("a0") and not kube_syntax.is_dns1035_label("0a")
    assert kube_syntax.is_dns1035_label("a" * 50, max_len=50) and not kube_syntax.is_dns1035_label("a" * 51, max_len=50)


@pytest.mark.parametrize(
    "ref",
    [
        "busybox",
        "registry.example/envpipe-runtime:1",
        "localhost:5000/envpipe/runtime:v0.1.0-rc1",
        "nvcr.io/nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
        "[2001:db8::1]:5000/repo:tag",
        "a__b/c.d-e:Tag_1",
        f"repo@{DIGEST}",
        f"Registry.Example.COM/repo:tag@{DIGEST}",
        "foo_bar.com:8080",
        "a" * 255,
    ],
)
def test_image_references(ref: str) -> None:
    assert kube_syntax.is_image_reference(ref)


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "Bad Image!!",
        "registry.example/Upper",
        "repo:",
        ":tag",
        "repo@sha256:abc",
        "repo:" + "t" * 129,
        "a" * 256,
        "repo/",
        "-repo",
        "repo//x",
        "img:1 ",
        "a" * 100_000,
    ],
)
def test_not_image_references(ref: str) -> None:
    assert not kube_syntax.is_image_reference(ref)
