"""``docker run`` / ``podman run`` (recipe form (b)): which words are options, which is the image, the
``--entrypoint``, and each option's value read into the Launch; shared by the one-command import and the
Ray-cluster one. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.importing import shellwords
from rigsmith.importing.recipe.command.bashc import is_shell_c, script_argv
from rigsmith.importing.recipe.command.containeropts import (
    device_node,
    gpus_request,
    set_shm,
    volume,
    whole_number,
)
from rigsmith.importing.recipe.envvars import env_var, passthrough
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import (
    _ASSIGN_RE,
    _PYTHON_RE,
    _SHELLS,
    DOCKER_BOOL_OPTS,
    DOCKER_DROPPED,
    DOCKER_VALUE_OPTS,
    IMAGE_ENTRYPOINT,
    LAUNCHERS,
)


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


def docker_run(words: Sequence[shellwords.Word], launch: Launch, line: int) -> None:
    tool = PurePosixPath(words[0].text).name
    if len(words) < 2 or words[1].text != "run":
        launch.problems.append(
            f"line {line}: '{tool} {words[1].text if len(words) > 1 else ''}' is not '{tool} run'"
        )
        return
    rest = list(words[2:])
    opts = docker_options(rest, launch, line, tool)
    if opts is None:
        return
    dropped, entrypoint, i = opts.dropped, opts.entrypoint, opts.image_at
    launch.published, launch.network = opts.published, opts.network
    for opt, val in opts.values:
        _docker_option(opt, val, launch, dropped, f"{tool} run {opt}")
    if i >= len(rest):
        launch.problems.append(f"line {line}: {tool} run names no image")
        return
    image = rest[i].text
    launch.image_expands = rest[i].expands
    launch.image = image
    after = rest[i + 1 :]
    texts = [w.text for w in after]
    shell = entrypoint if entrypoint is not None else (texts[0] if texts else None)
    container_argv = [entrypoint, *texts] if entrypoint is not None else texts
    if shell is not None and is_shell_c(container_argv):
        # `IMAGE bash -c SCRIPT`: the one command the script runs is the container's command
        got = script_argv(container_argv, f"line {line}: {tool} run {image}", launch)
        if got is None:
            return
        texts, env = got
        launch.env += [env_var(k, v, None, launch, f"line {line}") for k, v in env]
        after, entrypoint = [shellwords.Word(t, line) for t in texts], None
        base = PurePosixPath(texts[0]).name if texts else ""
        if base != "vllm" and not _PYTHON_RE.match(base):
            launch.problems.append(
                f"line {line}: the {shell} -c script in {image} runs {texts[0] if texts else 'nothing'!r}, "
                "not the vLLM server"
            )
            return
    elif shell is not None and PurePosixPath(shell).name in _SHELLS:
        how = f"--entrypoint {entrypoint}" if entrypoint is not None else f"{shell} after the image"
        script = "-c" in texts[: 2 if entrypoint is None else 1]
        what = "runs a shell script (-c …) in" if script else "starts an interactive shell in"
        launch.problems.append(
            f"line {line}: this is not a serving command: {how} {what} {image}, not the vLLM server; "
            "import the vllm serve (or python -m vllm.entrypoints.openai.api_server) command "
            f"{'the script runs' if script else 'you run inside it'} on its own"
        )
        return
    if entrypoint is not None:
        launch.recipe_executable = launch.executable = entrypoint
        launch.subcommand = ()
    elif texts and PurePosixPath(texts[0]).name == "vllm" and texts[1:2] == ["serve"]:
        launch.recipe_executable = texts[0]
        after = after[2:]
    elif (
        texts
        and _PYTHON_RE.match(PurePosixPath(texts[0]).name)
        and texts[1:3] == ["-m", LAUNCHERS["python"][1][1]]
    ):
        launch.recipe_executable = texts[0]
        launch.executable, launch.subcommand = LAUNCHERS["python"]
        launch.first_arg_positional_ok = False
        after = after[3:]
    else:
        launch.recipe_executable = f"{image} (image entrypoint)"
        launch.executable, launch.subcommand = IMAGE_ENTRYPOINT
        launch.notes.append(
            f"{tool} run: the image's entrypoint is taken to be `vllm serve` (as in vllm/vllm-openai); the "
            "args after the image are its arguments"
        )
    launch.args = [w.text for w in after]
    launch.arg_expands = [w.expands for w in after]
    if dropped:
        launch.notes.append(
            f"{tool} run options not imported (rigsmith sets name, restart, network and ports per target; "
            f"the server listens on --host/--port): {' '.join(dropped)}"
        )


def _docker_option(opt: str, val: str, launch: Launch, dropped: list[str], where: str) -> None:
    if opt == "--gpus":
        gpus_request(val, launch, where)
    elif opt == "--device":
        if specmod.CDI_RE.match(val):
            launch.gpu_cdi = [*(launch.gpu_cdi or []), val]
        else:
            device_node(val, launch, where)
    elif opt == "--shm-size":
        set_shm(val, launch, where)
    elif opt == "--ulimit":
        kind, _, limits = val.partition("=")
        if kind == "memlock":
            soft = limits.split(":", 1)[0]
            launch.memlock = "unlimited" if soft in ("-1", "unlimited") else whole_number(soft, launch, where)
        else:
            launch.notes.append(f"{where} {val}: not imported (only memlock is carried by every target)")
    elif opt in ("-e", "--env"):
        m = _ASSIGN_RE.match(val)
        if m:
            launch.env.append(env_var(m.group(1), m.group(2), None, launch, where))
        elif specmod.ENV_NAME_RE.match(val):
            launch.env.append(passthrough(val, launch, where))
        else:
            launch.problems.append(f"{where} {val!r}: not NAME=value or NAME")
    elif opt in ("-v", "--volume"):
        volume(val, launch, where)
    elif opt == "--ipc":
        launch.notes.append(f"{where}={val}: not imported; the container gets its own /dev/shm of shm_size")
    elif opt == "--stop-timeout":
        launch.stop_grace = whole_number(val, launch, where)
    elif opt in DOCKER_DROPPED:
        dropped.append(f"{opt} {val}")
    else:
        launch.notes.append(f"{where} {val}: not imported")
