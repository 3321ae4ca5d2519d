"""``docker run``'s options up to the image (recipe form (b)): which words are options, which is the image,
the ``--entrypoint``; shared by the one-command import and the Ray-cluster one. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rigsmith.importing import shellwords
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import DOCKER_BOOL_OPTS, DOCKER_DROPPED, DOCKER_VALUE_OPTS


@dataclasses.dataclass
class DockerOptions:
    """``docker run``'s options up to the image: where the image is in the words after ``run``, the
    ``--entrypoint`` (and its words' span), the options with values in order, the dropped switches."""

    image_at: int
    entrypoint: str | None = None
    entrypoint_span: tuple[int, int] | None = None
    values: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    #: Every ``-p``/``--publish`` value (``-P``/``--publish-all`` as ``""``: every port, every address).
    published: list[str] = dataclasses.field(default_factory=list)
    #: ``--network``/``--net``, the last one given.
    network: str | None = None


def docker_options(
    rest: Sequence[shellwords.Word], launch: Launch, line: int, tool: str
) -> DockerOptions | None:
    """Walk ``docker run``'s options (``rest``: the words after ``run``); None with the problem in
    ``launch`` when one is unknown or lacks its value (the image cannot be told from the args then)."""
    out = DockerOptions(image_at=len(rest))
    i = 0
    while i < len(rest):
        w = rest[i].text
        if w == "--":
            out.image_at = i + 1
            return out
        if not w.startswith("-"):
            out.image_at = i
            return out
        cluster = _short_cluster(w)
        if cluster is not None:
            # `-itd`, `-dp8000:8000`, `-itv /a:/b`: docker's short flags combine, the last may take a value.
            bools, value_opt, attached = cluster
            out.dropped += [f"-{c}" for c in bools if f"-{c}" in DOCKER_DROPPED]
            out.published += ["" for c in bools if c == "P"]
            if value_opt is None:
                i += 1
                continue
            opt, eq, val = value_opt, ("=" if attached else ""), attached
        else:
            opt, eq, val = w.partition("=") if w.startswith("--") else (w, "", "")
        if opt in DOCKER_BOOL_OPTS:
            if opt in DOCKER_DROPPED:
                out.dropped.append(w)
            if opt in ("-P", "--publish-all"):
                out.published.append("")
            i += 1
            continue
        if opt not in DOCKER_VALUE_OPTS:
            launch.problems.append(
                f"line {line}: unknown {tool} run option {opt!r}: cannot tell whether it takes a value, so "
                "the image and the vLLM args cannot be told apart; remove it or import a vllm serve command"
            )
            return None
        first = i
        if not eq:
            if i + 1 >= len(rest):
                launch.problems.append(f"line {line}: {tool} run option {opt} needs a value")
                return None
            val = rest[i + 1].text
            i += 2
        else:
            i += 1
        if opt == "--entrypoint":
            out.entrypoint, out.entrypoint_span = val, (first, i)
        elif opt in DOCKER_DROPPED:
            out.dropped.append(f"{opt} {val}")
            if opt in ("-p", "--publish"):
                out.published.append(val)
            elif opt in ("--network", "--net"):
                out.network = val
        else:
            out.values.append((opt, val))
    return out


#: ``docker run`` short options by letter: those that take no value and those that take one.
_DOCKER_SHORT_BOOL = frozenset(o[1] for o in DOCKER_BOOL_OPTS if len(o) == 2)
_DOCKER_SHORT_VALUE = frozenset(o[1] for o in DOCKER_VALUE_OPTS if len(o) == 2)


def _short_cluster(word: str) -> tuple[str, str | None, str] | None:
    """``-itd`` → ("itd", None, ""); ``-itp8000:8000`` → ("it", "-p", "8000:8000"); None when ``word`` is
    not a cluster of known short options (a single ``-x``, a long option, anything unknown)."""
    if word.startswith("--") or len(word) <= 2 or word in DOCKER_BOOL_OPTS:
        return None
    body = word[1:]
    for k, c in enumerate(body):
        if c in _DOCKER_SHORT_VALUE:
            rest = body[k + 1 :].removeprefix("=")
            return body[:k], f"-{c}", rest
        if c not in _DOCKER_SHORT_BOOL:
            return None
    return body, None, ""
