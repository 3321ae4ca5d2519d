"""Recipe form (b): command text — ``vllm serve``, ``python -m vllm…``, ``docker run`` / ``podman run``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from pydantic import ValidationError

from rigsmith import spec as specmod
from rigsmith.importing import multinode, shellwords
from rigsmith.importing.recipe.dockerrun import docker_options
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import (
    _ASSIGN_RE,
    _PYTHON_RE,
    _SECRET_NAME_RE,
    _SELF_REF_RE,
    _SHELLS,
    DOCKER_DROPPED,
    IMAGE_ENTRYPOINT,
    LAUNCHERS,
    SHELL_KEYWORDS,
    _words,
)

# -- format (b): shell command text ------------------------------------------------------------------


def _is_assignment(word: str) -> bool:
    return bool(_ASSIGN_RE.match(word))


#: Commands that run the next one in the same process tree and change nothing rigsmith carries: dropped with
#: a note. Value: the wrapper's options that take a value (``uv run --with vllm vllm serve …``).
WRAPPERS: Mapping[tuple[str, ...], frozenset[str]] = {
    ("sudo",): _words("-u --user -g --group -C -D --chdir"),
    ("exec",): frozenset(),
    ("uv", "run"): _words(
        "--with --with-editable --with-requirements --python -p --project --directory --env-file --extra "
        "--group --index --default-index --index-url --extra-index-url --package --module -m"
    ),
}


def _wrapper(argv: Sequence[str]) -> int:
    """How many leading words of ``argv`` are a wrapper (``sudo``, ``exec``, ``uv run [opts]``), else 0."""
    for head, value_opts in WRAPPERS.items():
        if tuple(argv[: len(head)]) != head:
            continue
        i = len(head)
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "--module"):
            i += 2 if argv[i] in value_opts else 1
        return i
    return 0


def _is_launcher(argv: Sequence[str]) -> bool:
    if not argv:
        return False
    argv = argv[_wrapper(argv) :]
    base = PurePosixPath(argv[0]).name if argv else ""
    return base in ("vllm", "docker", "podman") or bool(_PYTHON_RE.match(base))


def _sort_lines(
    script: shellwords.Script, launch: Launch
) -> tuple[list[specmod.EnvVar], list[shellwords.Command]]:
    """The script's lines: ``export``s (env), commands that may launch the engine, and what is neither
    (a note or, for control flow and orphaned options, a problem on ``launch``)."""
    exported: list[specmod.EnvVar] = []
    candidates: list[shellwords.Command] = []
    for cmd in script.commands:
        if cmd.argv == ["$"]:  # a prompt alone (`$ # comment`): nothing runs
            if cmd.comment:
                launch.notes.append(f"comment (line {cmd.line}): {cmd.comment}")
            continue
        if cmd.argv[0] == "$" and len(cmd.words) > 1:
            # A documentation prompt (`$ docker run …`, as in vLLM's older docs), not a word of the command.
            launch.notes.append(
                f"line {cmd.line}: the shell prompt '$ ' before the command is not part of it"
            )
            cmd = dataclasses.replace(cmd, words=cmd.words[1:])
        argv = cmd.argv
        if argv[0] in SHELL_KEYWORDS:
            launch.problems.append(
                f"line {cmd.line}: shell control flow ({argv[0]!r}): this is a script, not one command; "
                "import the vllm serve (or docker run) line on its own"
            )
        elif argv[0] == "export":
            for w in cmd.words[1:]:
                m = _ASSIGN_RE.match(w.text)
                if not m:
                    launch.problems.append(
                        f"line {cmd.line}: 'export {w.text}' sets no value; write NAME=value"
                    )
                    continue
                exported.append(_env_var(m.group(1), m.group(2), cmd.comment, launch, f"line {cmd.line}"))
        elif all(_is_assignment(a) for a in argv):
            launch.notes.append(
                f"line {cmd.line}: shell variable(s) {', '.join(a.split('=', 1)[0] for a in argv)} set "
                "without export (not passed to vLLM): not imported"
            )
        elif argv[0].startswith("-") and candidates:
            launch.problems.append(
                f"line {cmd.line} starts with the option {argv[0]!r}, but the line before it does not "
                "continue with '\\', so a shell runs it as a separate command; add the missing '\\' line "
                "continuations"
            )
        else:
            candidates.append(cmd)
    return exported, candidates


def _command_words(
    main: shellwords.Command, launch: Launch
) -> tuple[list[shellwords.Word], list[specmod.EnvVar]]:
    """The launch command's words without its ``NAME=value`` prefix (returned as env) and wrappers."""
    words = list(main.words)
    prefix: list[specmod.EnvVar] = []
    while words and _is_assignment(words[0].text):
        m = _ASSIGN_RE.match(words[0].text)
        assert m is not None
        prefix.append(_env_var(m.group(1), m.group(2), None, launch, f"line {main.line}"))
        words.pop(0)
    if skip := _wrapper([w.text for w in words]):
        wrapper = " ".join(w.text for w in words[:skip])
        launch.notes.append(
            f"line {main.line}: '{wrapper}' dropped (rigsmith's targets run the engine as needed)"
        )
        words = words[skip:]
    if main.comment:
        launch.notes.append(f"comment (line {main.line}): {main.comment}")
    if not words:
        launch.problems.append(f"line {main.line}: only variable assignments, no command")
        return [], prefix
    return words, prefix


def _from_shell(text: str) -> Launch:
    script = shellwords.scan(text)
    launch = Launch()
    launch.problems += script.problems
    launch.notes += script.notes
    for line, comment in script.comments:
        if comment:
            launch.notes.append(f"comment (line {line}): {comment}")
    exported, candidates = _sort_lines(script, launch)
    if (ray := _ray_cluster(candidates, exported, launch)) is not None:
        return ray
    launchers = [c for c in candidates if _is_launcher([a for a in c.argv if not _is_assignment(a)])]
    others = [c for c in candidates if c not in launchers]
    for c in others:
        launch.problems.append(
            f"line {c.line}: {c.argv[0]!r} is not a vLLM launch command (vllm serve, python -m "
            "vllm.entrypoints.openai.api_server, docker run or podman run); remove it"
        )
    group = multinode.node_args([c.argv for c in launchers]) if len(launchers) > 1 else None
    if group is not None:
        launch.node_args = group
    elif len(launchers) > 1:
        launch.problems.append(
            f"{len(launchers)} commands in one block (lines {', '.join(str(c.line) for c in launchers)}); "
            "rigsmith imports one command per deployment: keep the one this machine runs"
        )
    if not launchers:
        if not others and not launch.problems:
            launch.problems.append(
                "no command found: expected vllm serve, python -m vllm.entrypoints.openai.api_server, "
                "docker run or podman run"
            )
        return launch
    main = launchers[0]
    words, prefix = _command_words(main, launch)
    if not words:
        return launch
    base = PurePosixPath(words[0].text).name
    if base in ("docker", "podman"):
        if prefix:
            launch.problems.append(
                f"line {main.line}: {', '.join(e.name for e in prefix)} set before {base} run reach the "
                f"{base} client, not the container; pass them with -e NAME=value"
            )
        _docker(words, launch, main.line)
    else:
        _launcher(words, launch, main.line)
    launch.env = _merge_env([*exported, *prefix, *launch.env], launch)
    return launch


def _ray_cluster(
    candidates: Sequence[shellwords.Command], exported: Sequence[specmod.EnvVar], launch: Launch
) -> Launch | None:
    """``launch`` filled from a Ray cluster's commands, or None when the block starts no Ray node."""
    from rigsmith.importing.recipe import raycluster  # it uses this module's docker parsing

    ray = raycluster.split(candidates, launch)
    if ray is None:
        return None
    if ray.complete:
        raycluster.apply(ray, launch)
    launch.env = _merge_env([*exported, *launch.env], launch)
    return launch


def _launcher(words: Sequence[shellwords.Word], launch: Launch, line: int) -> None:
    exe = words[0].text
    base = PurePosixPath(exe).name
    rest = list(words[1:])
    if base == "vllm":
        if not rest or rest[0].text != "serve":
            sub = rest[0].text if rest else "(nothing)"
            launch.problems.append(
                f"line {line}: 'vllm {sub}' is not the server; rigsmith imports 'vllm serve MODEL ...'"
            )
            return
        launch.executable, launch.subcommand = LAUNCHERS["vllm"]
        rest = rest[1:]
    elif _PYTHON_RE.match(base):
        if [w.text for w in rest[:2]] != ["-m", "vllm.entrypoints.openai.api_server"]:
            launch.problems.append(
                f"line {line}: '{exe} {' '.join(w.text for w in rest[:2])}' is not vLLM's OpenAI server; "
                "expected python -m vllm.entrypoints.openai.api_server"
            )
            return
        launch.executable, launch.subcommand = LAUNCHERS["python"]
        launch.first_arg_positional_ok = False
        rest = rest[2:]
    else:  # pragma: no cover - _is_launcher filters these
        launch.problems.append(f"line {line}: unknown launcher {exe!r}")
        return
    launch.recipe_executable = exe
    launch.args = [w.text for w in rest]
    launch.arg_expands = [w.expands for w in rest]


def _docker(words: Sequence[shellwords.Word], launch: Launch, line: int) -> None:
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
    if shell is not None and PurePosixPath(shell).name in _SHELLS:
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
        _gpus_request(val, launch, where)
    elif opt == "--device":
        if specmod.CDI_RE.match(val):
            launch.gpu_cdi = [*(launch.gpu_cdi or []), val]
        else:
            _device_node(val, launch, where)
    elif opt == "--shm-size":
        _set_shm(val, launch, where)
    elif opt == "--ulimit":
        kind, _, limits = val.partition("=")
        if kind == "memlock":
            soft = limits.split(":", 1)[0]
            launch.memlock = "unlimited" if soft in ("-1", "unlimited") else _int(soft, launch, where)
        else:
            launch.notes.append(f"{where} {val}: not imported (only memlock is carried by every target)")
    elif opt in ("-e", "--env"):
        m = _ASSIGN_RE.match(val)
        if m:
            launch.env.append(_env_var(m.group(1), m.group(2), None, launch, where))
        elif specmod.ENV_NAME_RE.match(val):
            launch.env.append(_passthrough(val, launch, where))
        else:
            launch.problems.append(f"{where} {val!r}: not NAME=value or NAME")
    elif opt in ("-v", "--volume"):
        _volume(val, launch, where)
    elif opt == "--ipc":
        launch.notes.append(f"{where}={val}: not imported; the container gets its own /dev/shm of shm_size")
    elif opt == "--stop-timeout":
        launch.stop_grace = _int(val, launch, where)
    elif opt in DOCKER_DROPPED:
        dropped.append(f"{opt} {val}")
    else:
        launch.notes.append(f"{where} {val}: not imported")


def _device_node(val: str, launch: Launch, where: str) -> None:
    """A ``--device``/``devices:`` entry that is a device node: ROCm's (``/dev/kfd``, ``/dev/dri``) say the
    GPUs are AMD's (CDI ``amd.com/gpu``), whatever the env says; any other is noted, not imported."""
    node = val.split(":", 1)[0]
    if node in ("/dev/kfd", "/dev/dri") or node.startswith("/dev/dri/"):
        launch.gpu_vendor = "amd.com/gpu"
        launch.notes.append(
            f"{where} {val}: ROCm's device node; the GPUs are passed as amd.com/gpu CDI devices"
        )
    else:
        launch.notes.append(f"{where} {val}: a device node, not a CDI name; not imported (add a mount)")


def _gpus_request(val: str, launch: Launch, where: str) -> None:
    v = val.strip().strip("\"'")
    if v == "all":
        launch.gpus_all = f"{where} {val}"
        return
    count = specmod.ascii_int(v)
    if count is not None:
        launch.gpu_count = count
        return
    if v.startswith("device="):
        ids = [x.strip() for x in v.removeprefix("device=").split(",") if x.strip()]
        if ids and all(re.fullmatch(r"[A-Za-z0-9_.:-]+", x) for x in ids):
            launch.gpu_indices = ids
            return
    launch.problems.append(f"{where} {val!r}: not a GPU request rigsmith understands (all, N or device=I,J)")


def _set_shm(val: str, launch: Launch, where: str) -> None:
    m = specmod.SIZE_RE.match(str(val).strip())
    if not m:
        launch.problems.append(f"{where} {val!r}: not a size (write it like 8g)")
        return
    launch.shm_size = f"{m.group(1)}{m.group(2).lower()}"


def _int(val: str, launch: Launch, where: str) -> int | None:
    n = specmod.ascii_int(val)
    if n is None:
        launch.problems.append(f"{where} {val!r}: not a whole number (write it in ASCII digits 0-9)")
    return n


def _volume(val: str, launch: Launch, where: str) -> None:
    parts = val.split(":")
    if len(parts) < 2:
        launch.notes.append(f"{where} {val}: anonymous volume, not imported")
        return
    host, container = parts[0], parts[1]
    opts = parts[2].split(",") if len(parts) > 2 else []
    home = re.match(r"^(\$HOME|\$\{HOME\})(/|$)", host)
    if home:
        # `$HOME/x` and `~/x` name the same directory; the spec's mounts understand `~/`.
        launch.notes.append(f"{where} {val}: {home.group(1)} written as ~ in the mount")
        host = "~" + host[len(home.group(1)) :]
    if not host.startswith(("/", "~", "./", "../", "$")) and host not in (".", ".."):
        launch.notes.append(f"{where} {val}: named volume, not imported (use a host directory)")
        return
    try:
        launch.mounts.append(specmod.Mount(host=host, container=container, readonly="ro" in opts))
        if "rw" in opts:
            launch.writable.add(container)
    except ValidationError as err:
        for path, msg in specmod.problems_from(err):
            launch.problems.append(f"{where} {val!r}: {path}: {msg}")
    if "$" in host:
        launch.notes.append(
            f"{where} {val}: the host path holds shell syntax, kept literally; set a real path"
        )


def _secret_var(
    name: str, value: str, note: str | None, where: str, **flags: bool
) -> tuple[specmod.EnvVar, str] | None:
    """A variable whose name says it holds a secret, with its value dropped (never stored in the spec),
    and the note that says so; None for any other variable. Every env source goes through here."""
    if not _SECRET_NAME_RE.search(name) or "$" in value or not value:
        return None
    if specmod.PLACEHOLDER_RE.fullmatch(value):
        return specmod.EnvVar(name=name, value="", note=note, secret=True, **flags), (
            f"{where}: {name} is a secret (placeholder {value} dropped); it is read from the host "
            "environment at run time"
        )
    return specmod.EnvVar(name=name, value="", note=note, secret=True, **flags), (
        f"{where}: the value of {name} was dropped (a secret is never stored in the spec); it is read from "
        "the host environment at run time"
    )


def _env_var(name: str, value: str, note: str | None, launch: Launch, where: str) -> specmod.EnvVar:
    secret = bool(_SECRET_NAME_RE.search(name))
    m = _SELF_REF_RE.match(value)
    if m and m.group(1) == name:
        launch.notes.append(f"{where}: {name}={value} is read from the host environment at run time")
        return specmod.EnvVar(name=name, value=value, note=note, secret=True)
    if m and secret:
        # `-e HUGGING_FACE_HUB_TOKEN=$HF_TOKEN`: the container's NAME is the host's other variable. The
        # value keeps that mapping; every target passes a secret by its own name, so say what to export.
        launch.notes.append(
            f"{where}: {name}={value} reads the secret {name} from the host's {m.group(1)}; "
            "env[].value keeps "
            f'that mapping, and the targets pass {name} by name: export {name}="${m.group(1)}" (or create '
            f"the podman secret {name}) before starting"
        )
        return specmod.EnvVar(
            name=name, value=value, note=note or f"from the host's {m.group(1)}", secret=True
        )
    lifted = _secret_var(name, value, note, where)
    if lifted is not None:
        launch.notes.append(lifted[1])
        if not specmod.PLACEHOLDER_RE.fullmatch(value):  # a <placeholder> is no secret to scrub
            launch.secrets.append(value)
        return lifted[0]
    if "$" in value or "`" in value:
        launch.notes.append(
            f"{where}: {name}={value} holds shell syntax that a shell would expand; kept literally, "
            "replace it with the value you mean"
        )
    return specmod.EnvVar(name=name, value=value, note=note, secret=secret)


def _passthrough(name: str, launch: Launch, where: str) -> specmod.EnvVar:
    launch.notes.append(f"{where}: {name} is passed through from the host environment at run time")
    return specmod.EnvVar(name=name, value="", secret=True, note="passed through from the host environment")


def _merge_env(env: Sequence[specmod.EnvVar], launch: Launch) -> list[specmod.EnvVar]:
    """Later settings of a name win (a prefix beats an export), as in the shell; repeats are noted."""
    out: dict[str, specmod.EnvVar] = {}
    for e in env:
        old = out.get(e.name)
        if old is not None:
            same = (
                "with the same value" if old.value == e.value else f"({old.value!r} → {e.value!r}, last wins)"
            )
            launch.notes.append(f"env {e.name} is set twice {same}")
            if e.note is None and old.note is not None:
                e = e.model_copy(update={"note": old.note})
        out[e.name] = e
    return list(out.values())
