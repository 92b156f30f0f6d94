"""The kubelet's expansion of $(VAR) and $$ in a container's command, args and env values, for tests
that check what a pod's process really receives (the kube backend's escaping, the e2e node)."""

from __future__ import annotations


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
