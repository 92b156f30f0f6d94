"""Kubernetes names, image references and $(VAR) escaping (envpipe_launch.kube_syntax), and the escaping
where the kube backend builds its pods' commands and env values."""

from __future__ import annotations

import shlex

import pytest
from envpipe_launch import kube_syntax
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import KubeJob
from hypothesis import given, settings
from hypothesis import strategies as st

DIGEST = "sha256:" + "a" * 64


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's command, args and env values (a model of
    k8s.io/kubernetes third_party/forked/golang/expansion.Expand, written from its documented rules):
    `$$` is `$`; `$(NAME)` is NAME's value, or left as written when NAME is not defined; an unclosed
    `$(`, a `$` before any other character and a trailing `$` stay as they are."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and ")" in text[i + 2 :]:
            end = text.index(")", i + 2)
            name = text[i + 2 : end]
            out.append(env.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


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
    job = KubeJob(spec, "j", "default", "img:1", no_ssh=True)
    for pod in (job.worker_pod(0, "uid"), KubeJob(spec, "j", "default", "img:1").launcher_pod("uid", "10.0.0.1")):
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: kubelet_expand(e["value"], {}) for e in container["env"]}
        assert env["GREETING"] == "$(HOSTNAME)"
        command = [kubelet_expand(part, {**env, "HOSTNAME": "pod-0"}) for part in container["command"]]
        assert command[:2] == ["/bin/sh", "-c"] and shlex.split(command[2])[-5:] == ["train.py", *args]


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
