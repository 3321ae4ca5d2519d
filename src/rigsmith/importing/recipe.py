"""Recipe import, the pure part: recipe text → :class:`rigsmith.spec.Deployment`.

Three formats (``parse`` picks one): (a) the recipe JSON (``title``/``command``/``env``/``notes``),
(b) raw command text — ``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``, ``docker run`` /
``podman run`` — with continuations, comments, ``VAR=value`` prefixes and ``export`` lines, (c) a compose
file holding one vLLM service. The argv is kept exactly as a POSIX shell parses it (see
:mod:`rigsmith.shellwords`); whatever a shell would read differently from what the author meant is
refused with a reason that names the line or field. Facts the notes state in prose (Hub repo, size,
GPUs, shm, memlock, stop grace, readiness, config patches) are read with the regex table
``NOTE_FACTS``; the notes themselves are kept verbatim.

Decisions (each is a corpus case in tests/recipes/corpus_expected.yaml):

- A comment that ends in ``\\``, a ``\\`` followed by a space, two commands, shell control flow, shell
  operators (``;``, ``&``, ``|``, ``&&``) and a missing space that glues two words: refused.
- Blank lines after a ``\\`` (a web-paste artifact): accepted, joined, and said so in ``notes``.
- ``$VAR``, ``$(…)`` and backticks are never expanded; they are kept literally and listed in ``notes``.
  ``-e NAME=$NAME`` / ``NAME=$NAME`` is a pass-through from the host environment.
- ``<name>`` tokens are placeholders: kept in the value, listed in ``placeholders`` with no value, so
  ``deploy`` refuses until the user fills each one.
- The model is a Hub repo (``owner/name``), a path the notes tie to one (``hf download REPO --local-dir
  DIR``), or a local checkpoint: ``model.repo: null``, ``model.local_dir`` the path, never downloaded.
  An absolute or ``~/`` path is that directory; ``./x`` and a bare name that is not ``owner/name``
  (``Qwen2.5-VL-32B-Instruct``) are a directory relative to where the recipe ran, because vLLM opens a
  local directory of that name before it asks the Hub — imported as ``./NAME`` with a note, and
  ``deploy``/``fetch-model`` refuse it until the user writes the absolute path. In a ``docker run`` /
  compose recipe the path is inside the container: the bind mount that holds it gives the host directory
  (``$(pwd)``/``$PWD`` as ``.``); no such mount, or a mount whose host side is ``$VAR``, is refused.
  ``...``, ``<placeholder>``, ``/path/to/…`` documentation paths, ``~user/…`` and ``$VAR`` are refused.
- Compose ``${VAR:-default}`` interpolation is refused (rigsmith would have to guess the value); ``$$``
  is compose's escape for a literal ``$``.
- GPUs: explicit device ids win (``--gpus device=2,3``, CDI ``--device``, or ``CUDA_VISIBLE_DEVICES`` /
  ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` when the container would see every GPU: those pick
  the CDI devices and the variable is renumbered ``0..N-1`` for the container), then a count in the notes,
  then the product of the flags that multiply GPUs (:mod:`rigsmith.importing.vllmflags`: TP × PP ×
  prefill context parallel × data parallel local, else data parallel); CDI names ``nvidia.com/gpu=…``
  (``amd.com/gpu`` when the env is ROCm's). ``--gpus all`` and ``VENDOR=all`` are pinned to
  ``VENDOR=0..N-1`` so every target carries the same explicit devices.
- The model is the first positional (options before it are skipped by their arity), or ``--model``. A GGUF
  Hub reference ``owner/repo:QUANT`` is the repo with a ``*QUANT*.gguf`` file pattern. A ``docker run``
  volume whose container path *is* the model becomes the model mount. Secondary Hub models (a
  ``--speculative-config`` draft, ``--tokenizer``, ``--lora-modules``) are listed in ``secondary_models``.
- A JSON flag given in the ``key=value,…`` form of older vLLM releases is passed through with a note.
- ``docker run IMAGE /bin/bash``, ``--entrypoint /bin/bash``, a Kubernetes manifest or a kubectl call is
  refused in one paragraph as "not a serving command"; an image from ``$VAR`` is refused at import.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml
from pydantic import ValidationError

from rigsmith import policy
from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing import multinode, shellwords, vllmflags

# -- knowledge tables ---------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: vLLM flags whose value is JSON (argparse ``type=json.loads``-like); a bad value is refused.
JSON_FLAGS = vllmflags.JSON_FLAGS

#: ``docker run`` / ``podman run`` options that take a value (so the image is found correctly): docker's
#: full ``docker run --help`` list plus podman's own. Short forms combine (``-itd``, ``-dp8000:8000``).
DOCKER_VALUE_OPTS = _words(
    """
    --gpus --device -p --publish -v --volume -e --env --env-file --name --ipc --shm-size --ulimit
    --runtime --restart --network --net -w --workdir --entrypoint --mount --security-opt --cap-add
    --cap-drop -u --user -l --label --hostname --platform --pull -m --memory --cpus --pid --log-opt
    --log-driver --add-host --group-add --stop-timeout --stop-signal --health-cmd --tmpfs --cgroupns
    --userns --uts
    -a --attach --annotation --blkio-weight --blkio-weight-device --cgroup-parent --cidfile --cpu-period
    --cpu-quota --cpu-rt-period --cpu-rt-runtime -c --cpu-shares --cpuset-cpus --cpuset-mems
    --device-cgroup-rule --device-read-bps --device-read-iops --device-write-bps --device-write-iops
    --detach-keys --dns --dns-option --dns-search --domainname --expose --health-interval --health-retries
    --health-start-period --health-start-interval --health-timeout -h --ip --ip6 --isolation
    --kernel-memory --label-file --link --link-local-ip --mac-address --memory-reservation --memory-swap
    --memory-swappiness --network-alias --oom-score-adj --pids-limit --storage-opt --sysctl
    --volume-driver --volumes-from
    --arch --authfile --cgroups --cgroup-conf --chrootdirs --conmon-pidfile --decryption-key --gidmap
    --hooks-dir --init-path --os --passwd-entry --personality --pidfile --pod --pod-id-file
    --preserve-fds --rdt-class --requires --retry --retry-delay --sdnotify --seccomp-policy --secret
    --subgidname --subuidname --systemd --timeout --uidmap --umask --variant --image-volume
    """
)
DOCKER_BOOL_OPTS = _words(
    """
    -d --detach --rm -i --interactive -t --tty -it -ti -dit --privileged --init --read-only
    -P --publish-all -q --quiet --disable-content-trust --no-healthcheck --oom-kill-disable --sig-proxy
    --use-api-socket --env-host --http-proxy --no-hosts --passwd --read-only-tmpfs --replace --rmi
    --rootfs --tls-verify
    """
)
#: Options rigsmith decides per target; importing drops them and says so.
DOCKER_DROPPED = _words(
    """
    --name --restart --rm -d --detach -i -t -it -ti -dit --interactive --tty --runtime --network
    --net -p --publish -P --publish-all --privileged --init --pull --platform --log-opt --log-driver
    --hostname
    """
)

#: Launchers: executable basename → (executable inside the container, subcommand it needs).
LAUNCHERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "vllm": ("vllm", ("serve",)),
    "python": ("python3", ("-m", "vllm.entrypoints.openai.api_server")),
    "python3": ("python3", ("-m", "vllm.entrypoints.openai.api_server")),
}
_PYTHON_RE = re.compile(r"^python3?(\.\d+)?$")

#: The vLLM images' entrypoint (vllm/vllm-openai runs ``vllm serve`` with the container command as args).
IMAGE_ENTRYPOINT = ("vllm", ("serve",))

#: Commands that start a shell instead of a server (``docker run -it IMAGE /bin/bash``).
_SHELLS = _words("bash sh zsh ash dash fish")

SHELL_KEYWORDS = _words(
    """
    if then else elif fi for while until do done case esac function select { }
    """
)

#: GPU name → (VRAM GiB per card, CUDA arch).
GPUS: Mapping[str, tuple[float, str]] = {
    "RTX 3090": (24.0, "sm_86"),
    "RTX 3090 Ti": (24.0, "sm_86"),
    "RTX 4090": (24.0, "sm_89"),
    "RTX 5090": (32.0, "sm_120"),
    "RTX 5060 Ti": (16.0, "sm_120"),
    "RTX 5070 Ti": (16.0, "sm_120"),
    "RTX A6000": (48.0, "sm_86"),
    "H100": (80.0, "sm_90"),
    "H200": (141.0, "sm_90"),
}

#: Env names that mark the vendor of the GPUs (CDI vendor/class).
GPU_VENDOR_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|VLLM_ROCM_\w+|MIOPEN_\w+)$"), "amd.com/gpu"),
)
DEFAULT_GPU_VENDOR = "nvidia.com/gpu"

#: Whole ``_``-separated words, so HF_TOKEN is a secret and TOKENIZERS_PARALLELISM is not.
_SECRET_NAME_RE = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|API_KEY|ACCESS_KEY|CREDENTIALS?)(_|$)", re.IGNORECASE
)
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_SELF_REF_RE = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
#: A Kubernetes manifest (``apiVersion:`` with ``kind:``) or a kubectl/helm call, anywhere in the text.
_KUBE_RE = re.compile(
    r"(?m)^[ \t]*(?:(?:sudo[ \t]+)?(?P<tool>kubectl|helm|oc)[ \t]+\w"
    r"|apiVersion:[ \t]*\S+[ \t]*\n(?:.*\n)*?[ \t]*kind:)"
)
_SERVICES_RE = re.compile(r"^services:[ \t]*(#.*)?$", re.MULTILINE)
_COMPOSE_VAR_RE = re.compile(r"(?<!\$)\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*)")

#: Facts the recipe notes state in prose: (fact, pattern). The named groups are read by ``_note_facts``.
NOTE_FACTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "download",
        re.compile(
            r"(?:hf|huggingface-cli) download (?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)"
            r"(?: --revision (?P<rev>\S+))? --local-dir (?P<dir>[^\s,;)]+)"
            r"(?: --revision (?P<rev2>[^\s,;)]+))?"
            r"(?: \((?P<size>\d+(?:\.\d+)?) ?(?P<unit>[KMGT]i?B)\))?"
        ),
    ),
    (
        "gpus",
        re.compile(
            r"(?P<count>\d+)\s*[x×]\s*(?P<model>RTX (?:PRO )?A?\d{4}(?: Ti)?|[AHBL]\d{2,3}|MI\d{3}X?)"
            r"(?:\s*\((?P<arch>sm_\d+)\))?"
        ),
    ),
    ("p2p", re.compile(r"\bP2P (?P<p2p>required|recommended)", re.IGNORECASE)),
    ("no_nvlink", re.compile(r"\bno NVLink\b", re.IGNORECASE)),
    ("host_ram", re.compile(r"(?P<gb>\d+(?:\.\d+)?) ?GB host RAM")),
    ("disk", re.compile(r"~?(?P<gb>\d+(?:\.\d+)?) ?GB disk")),
    ("shm", re.compile(r"\bshm_size (?P<size>\d+(?:\.\d+)?[kmgtKMGT]?)\b")),
    ("memlock", re.compile(r"\bmemlock (?P<memlock>-1|unlimited|\d+)")),
    ("stop_grace", re.compile(r"\bstop_grace_period (?P<seconds>\d+)s\b")),
    ("ready", re.compile(r"ready when the log shows (?P<lines>'[^']+'(?:(?:,\s*|,?\s+and\s+)'[^']+')*)")),
    ("kv_tokens", re.compile(r"GPU KV cache size: (?P<tokens>\d[\d,]*) tokens")),
    ("startup", re.compile(r"Startup ~?(?P<lo>\d+)(?:-(?P<hi>\d+))? min\w* first boot", re.IGNORECASE)),
    ("warm", re.compile(r"first boot[^,]*, ~?(?P<lo>\d+)(?:-(?P<hi>\d+))? min\w* after")),
    (
        "patch",
        re.compile(
            r"(?P<key>[A-Za-z_]\w*): (?P<value>[^\s,;]+) inside (?P<parent>[A-Za-z_][\w.]*)"
            r"(?: \((?P<note>[^)]*)\))?"
        ),
    ),
)

_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SIZE_UNITS["TIB"] = 2**40


# -- intermediate ------------------------------------------------------------------------------------


@dataclass
class Launch:
    """What one launch command says, before it becomes a Deployment. Problems collect refusals."""

    recipe_executable: str = "vllm"
    executable: str = "vllm"
    subcommand: tuple[str, ...] = ("serve",)
    args: list[str] = field(default_factory=list)
    arg_expands: list[bool] = field(default_factory=list)
    first_arg_positional_ok: bool = True
    env: list[specmod.EnvVar] = field(default_factory=list)
    image: str | None = None
    #: The image word holds shell syntax (``$IMAGE``): its value is unknown.
    image_expands: bool = False
    gpu_indices: list[str] | None = None
    gpu_cdi: list[str] | None = None
    #: The GPU vendor the launch itself shows (ROCm's /dev/kfd), ahead of the env's hints.
    gpu_vendor: str | None = None
    gpu_count: int | None = None
    shm_size: str | None = None
    memlock: str | int | None = None
    stop_grace: int | None = None
    mounts: list[specmod.Mount] = field(default_factory=list)
    #: Secret values taken out of the args and env; scrubbed from every other field (comments, notes).
    secrets: list[str] = field(default_factory=list)
    #: Container paths of the mounts the recipe marked ``:rw`` (it says it writes there).
    writable: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: One argv per node (after ``vllm serve``, head first) when the block is a multi-node group.
    node_args: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class Meta:
    """What the recipe says besides its command."""

    title: str | None = None
    recipe_id: str | None = None
    env_text: str | None = None
    env_map: Mapping[str, str | None] | None = None
    notes_text: str | None = None
    provenance: specmod.Provenance | None = None


# -- entry point -------------------------------------------------------------------------------------


def parse(
    text: str,
    *,
    source: str,
    sha256: str,
    name: str | None = None,
    image: str | None = None,
) -> specmod.Deployment:
    """Recipe text (any of the three formats) → a validated Deployment, or RecipeError with every reason.

    Args:
        text: the recipe as fetched (decoded).
        source: where it came from (URL or path), recorded in provenance and used in messages.
        sha256: hex digest of the fetched bytes.
        name: deployment name (default: from the recipe id, title or model).
        image: container image to use when the recipe names none (or to replace the one it names).
    """
    if "\x00" in text:
        at = text.index("\x00")
        line = text.count("\n", 0, at) + 1
        raise _refuse(
            source,
            [
                f"line {line} column {at - (text.rfind(chr(10), 0, at) + 1) + 1}: a NUL character, which "
                "no shell, unit file or YAML reader carries; remove it"
            ],
        )
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{"):
        launch, meta = _from_json(text, source)
    else:
        manifest = _KUBE_RE.search(text)
        if manifest is not None:
            raise _refuse(
                source,
                [
                    f"line {text.count(chr(10), 0, manifest.start()) + 1}: this is not a serving command but "
                    f"a Kubernetes manifest or a {manifest.group('tool') or 'kubectl'} call "
                    "(rigsmith renders those itself: `--target kube`); import the vllm serve, python -m "
                    "vllm.entrypoints.openai.api_server, docker run or compose text that its container runs"
                ],
            )
        data = _compose_data(text, source)
        if data is not None:
            launch = _from_compose(data)
            meta = Meta()
        else:
            launch = _from_shell(text)
            meta = Meta()
    meta = Meta(
        title=meta.title,
        recipe_id=meta.recipe_id,
        env_text=meta.env_text,
        env_map=meta.env_map,
        notes_text=meta.notes_text,
        provenance=_provenance(source, sha256, meta),
    )
    return build(launch, meta, source=source, name=name, image=image)


def _provenance(source: str, sha256: str, meta: Meta) -> specmod.Provenance:
    return specmod.Provenance(source=source, sha256=sha256, title=meta.title, recipe_id=meta.recipe_id)


def _refuse(source: str, problems: Sequence[str]) -> RecipeError:
    lines = [f"{source}: cannot import this recipe ({len(problems)} problem(s))"]
    lines += [f"  - {p}" for p in problems]
    return RecipeError(
        "\n".join(lines),
        hint="fix the recipe text (a local copy is fine: `invoke import-recipe PATH`) and import again",
    )


# -- format (a): recipe JSON -------------------------------------------------------------------------

_JSON_FIELDS = ("id", "title", "command", "env", "notes")


def _from_json(text: str, source: str) -> tuple[Launch, Meta]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecipeError(
            f"{source}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
            hint='a recipe JSON needs at least a "command" string',
        ) from None
    except RecursionError:
        raise RecipeError(
            f"{source}: the recipe JSON is nested more than {specmod.MAX_DEPTH} levels deep",
            hint="a recipe JSON is a flat object",
        ) from None
    problem = specmod.tree_problem(data)
    if problem:
        raise RecipeError(f"{source}: the recipe JSON {problem}", hint="a recipe JSON is a flat object")
    if not isinstance(data, dict):
        raise RecipeError(f'{source}: the recipe JSON must be an object with a "command" string')
    problems = []
    for key in ("id", "title", "command", "notes"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            problems.append(f"{key}: must be a string, got {type(data[key]).__name__}")
    command = data.get("command")
    if command is None or (isinstance(command, str) and not command.strip()):
        problems.append("command: missing or empty; the recipe must give the vLLM command as a string")
    env = data.get("env")
    env_text: str | None = None
    env_map: dict[str, str | None] | None = None
    if isinstance(env, str):
        env_text = env
    elif isinstance(env, dict):
        env_map = {}
        for k, v in env.items():
            if not isinstance(v, str | int | float) and v is not None:
                problems.append(f"env.{k}: must be a string, got {type(v).__name__}")
            else:
                env_map[str(k)] = None if v is None else str(v)
    elif env is not None:
        problems.append(f"env: must be a string or an object, got {type(env).__name__}")
    if problems:
        raise _refuse(source, problems)
    launch = _from_shell(data["command"])
    extra = sorted(set(data) - set(_JSON_FIELDS))
    for key in extra:
        launch.notes.append(f"recipe field {key!r} not imported: {json.dumps(data[key], ensure_ascii=False)}")
    meta = Meta(
        title=data.get("title"),
        recipe_id=data.get("id"),
        env_text=env_text,
        env_map=env_map,
        notes_text=data.get("notes"),
    )
    return launch, meta


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


def _from_shell(text: str) -> Launch:
    script = shellwords.scan(text)
    launch = Launch()
    launch.problems += script.problems
    launch.notes += script.notes
    for line, comment in script.comments:
        if comment:
            launch.notes.append(f"comment (line {line}): {comment}")
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
    i = 0
    dropped: list[str] = []
    image: str | None = None
    entrypoint: str | None = None
    while i < len(rest):
        w = rest[i].text
        if w == "--":
            i += 1
            if i < len(rest):
                image = rest[i].text
            break
        if not w.startswith("-"):
            image = w
            break
        cluster = _short_cluster(w)
        if cluster is not None:
            # `-itd`, `-dp8000:8000`, `-itv /a:/b`: docker's short flags combine, the last may take a value.
            bools, value_opt, attached = cluster
            dropped += [f"-{c}" for c in bools if f"-{c}" in DOCKER_DROPPED]
            if value_opt is None:
                i += 1
                continue
            opt, eq, val = value_opt, ("=" if attached else ""), attached
        else:
            opt, eq, val = w.partition("=") if w.startswith("--") else (w, "", "")
        if opt in DOCKER_BOOL_OPTS:
            if opt in DOCKER_DROPPED:
                dropped.append(w)
            i += 1
            continue
        if opt not in DOCKER_VALUE_OPTS:
            launch.problems.append(
                f"line {line}: unknown {tool} run option {opt!r}: cannot tell whether it takes a value, so "
                "the image and the vLLM args cannot be told apart; remove it or import a vllm serve command"
            )
            return
        if not eq:
            if i + 1 >= len(rest):
                launch.problems.append(f"line {line}: {tool} run option {opt} needs a value")
                return
            val = rest[i + 1].text
            i += 2
        else:
            i += 1
        if opt == "--entrypoint":
            entrypoint = val
        else:
            _docker_option(opt, val, launch, dropped, f"{tool} run {opt}")
    if image is None:
        launch.problems.append(f"line {line}: {tool} run names no image")
        return
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


# -- format (c): compose -----------------------------------------------------------------------------


def _compose_data(text: str, source: str) -> dict[str, Any] | None:
    """The compose mapping if ``text`` is YAML with ``services``, else None (then it is shell text)."""
    if not _SERVICES_RE.search(text):
        return None
    try:
        data = specmod.load_yaml(text)
    except yaml.YAMLError as err:
        raise RecipeError(
            f"{source}: has a `services:` line, so it is read as a compose file, but it is not valid YAML: "
            + " ".join(str(err).split()),
            hint="fix the YAML, or import the vllm serve command on its own",
        ) from None
    except RecursionError:
        raise RecipeError(
            f"{source}: the compose file is nested more than {specmod.MAX_DEPTH} levels deep",
            hint="a compose file with one vLLM service is a few levels deep; import the service itself",
        ) from None
    if not (isinstance(data, dict) and isinstance(data.get("services"), dict)):
        return None
    problem = specmod.tree_problem(data)
    if problem:
        raise RecipeError(
            f"{source}: the compose file {problem}", hint="import a compose file with plain values"
        )
    return data


def _runs_vllm(svc: Any) -> bool:
    if not isinstance(svc, dict):
        return False
    blob = json.dumps([svc.get("image"), svc.get("entrypoint"), svc.get("command")])
    return "vllm" in blob.lower()


def _unescape(value: str) -> str:
    return value.replace("$$", "$")


def _interpolations(value: Any, path: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        for m in _COMPOSE_VAR_RE.finditer(value):
            yield path, m.group(0)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _interpolations(v, f"{path}.{k}")
    elif isinstance(value, list):
        for idx, v in enumerate(value):
            yield from _interpolations(v, f"{path}[{idx}]")


def _compose_env_ref(env: Any, path: str, where: str) -> bool:
    """Whether the environment entry at ``path`` is exactly one variable reference (``${VAR}``/``$VAR``)."""
    key = path.removeprefix(f"{where}.environment")
    if isinstance(env, dict) and key.startswith("."):
        value = env.get(key[1:])
    elif isinstance(env, list) and key.startswith("[") and key.endswith("]") and key[1:-1].isdigit():
        value = str(env[int(key[1:-1])]).partition("=")[2]
    else:
        return False
    return isinstance(value, str) and bool(_SELF_REF_RE.fullmatch(value))


def _from_compose(data: dict[str, Any]) -> Launch:
    launch = Launch()
    services = data["services"]
    vllm = [name for name, svc in services.items() if _runs_vllm(svc)]
    if len(vllm) != 1:
        found = f"{len(vllm)} ({', '.join(vllm)})" if vllm else "none"
        launch.problems.append(
            f"services: exactly one service must run vLLM, found {found}; import a file with one vLLM service"
        )
        return launch
    name = vllm[0]
    svc: dict[str, Any] = services[name]
    where = f"services.{name}"
    entry = svc.get("entrypoint")
    entry_list = _compose_words(entry, f"{where}.entrypoint", launch) if entry is not None else None
    if (
        entry_list
        and PurePosixPath(entry_list[0]).name in ("bash", "sh", "dash", "zsh")
        and "-c" in entry_list
    ):
        launch.problems.append(
            f"{where}.entrypoint: runs a shell script ({entry_list[0]} -c …); rigsmith runs vLLM's "
            "argv directly and does not import scripts — replace it with the vllm serve command it runs"
        )
    # `NAME: ${VAR}` in environment is the shell's `-e NAME=$VAR`: read from the host at run time.
    seen = [
        (p, v)
        for p, v in _interpolations(svc, where)
        if not (p.startswith(f"{where}.environment") and _compose_env_ref(svc.get("environment"), p, where))
    ]
    if seen:
        shown = "; ".join(f"{p}: {v}" for p, v in seen[:6]) + (
            f"; … {len(seen) - 6} more" if len(seen) > 6 else ""
        )
        secret = sorted(
            {
                n
                for _, v in seen
                if _SECRET_NAME_RE.search(n := v.strip("${}").split(":", 1)[0].split("-", 1)[0])
            }
        )
        launch.problems.append(
            f"compose interpolation is not imported (rigsmith would have to guess each value): {shown}. "
            "Replace each ${VAR:-default} with the value you run"
            + (
                f"; a secret ({', '.join(secret)}) is never written into a file: pass it only under "
                "environment: as NAME: ${NAME}, which rigsmith reads from the host at run time"
                if secret
                else ""
            )
        )
    if launch.problems:
        return launch
    image = svc.get("image")
    if not isinstance(image, str) or not image:
        launch.problems.append(f"{where}.image: missing; the service must name its image")
        return launch
    launch.image = image
    command = svc.get("command")
    cmd = _compose_words(command, f"{where}.command", launch) if command is not None else []
    if isinstance(command, list):
        for idx, item in enumerate(cmd):
            if item.startswith("--") and " " in item and "=" not in item.split(" ", 1)[0]:
                launch.problems.append(
                    f"{where}.command[{idx}]: {item!r} is ONE argument containing a space (a YAML list item "
                    "is passed whole), which vLLM rejects; split it into two items"
                )
    if entry_list == []:
        # `entrypoint: []` clears the image's entrypoint: the command's first word is the executable.
        if not cmd:
            launch.problems.append(
                f"{where}: entrypoint is [] and command is empty, so nothing would run; "
                "write the vllm serve command under command:"
            )
            return launch
        entry_list, cmd = cmd[:1], cmd[1:]
    if entry_list and any(c.isspace() for c in entry_list[0]):
        launch.problems.append(
            f"{where}: the executable {entry_list[0]!r} contains whitespace (a YAML list item is passed "
            "whole, so no such program exists); split it into one item per word"
        )
        return launch
    full = [*(entry_list or []), *cmd]
    if entry_list:
        exe = entry_list[0]
        if PurePosixPath(exe).name == "vllm" and full[1:2] == ["serve"]:
            launch.recipe_executable, launch.executable, launch.subcommand = exe, "vllm", ("serve",)
            full = full[2:]
        else:
            launch.recipe_executable = launch.executable = exe
            launch.subcommand = tuple(entry_list[1:])
            full = cmd
    elif full and PurePosixPath(full[0]).name == "vllm" and full[1:2] == ["serve"]:
        launch.recipe_executable = full[0]
        full = full[2:]
    else:
        launch.recipe_executable = f"{image} (image entrypoint)"
        launch.notes.append(
            f"{where}: the image's entrypoint is taken to be `vllm serve` (as in vllm/vllm-openai); "
            "command holds its arguments"
        )
    launch.args = full
    launch.arg_expands = [False] * len(full)
    _compose_env(svc.get("environment"), f"{where}.environment", launch)
    for idx, dev in enumerate(svc.get("devices") or []):
        if isinstance(dev, str) and specmod.CDI_RE.match(dev):
            launch.gpu_cdi = [*(launch.gpu_cdi or []), dev]
        elif isinstance(dev, str) and dev.startswith("/dev/"):
            _device_node(dev, launch, f"{where}.devices[{idx}]")
        else:
            launch.notes.append(f"{where}.devices[{idx}] {dev!r}: not a CDI name; not imported")
    _compose_gpus(svc.get("deploy"), f"{where}.deploy", launch)
    if "shm_size" in svc:
        _set_shm(str(svc["shm_size"]), launch, f"{where}.shm_size")
    ulimits = svc.get("ulimits") or {}
    if isinstance(ulimits, dict) and "memlock" in ulimits:
        ml = ulimits["memlock"]
        soft = ml.get("soft") if isinstance(ml, dict) else ml
        launch.memlock = (
            "unlimited" if str(soft) in ("-1", "unlimited") else _int(str(soft), launch, f"{where}.ulimits")
        )
    if "stop_grace_period" in svc:
        launch.stop_grace = _duration(str(svc["stop_grace_period"]), launch, f"{where}.stop_grace_period")
    for idx, vol in enumerate(svc.get("volumes") or []):
        if isinstance(vol, str):
            _volume(vol, launch, f"{where}.volumes[{idx}]")
        else:
            launch.notes.append(f"{where}.volumes[{idx}]: long syntax not imported: {json.dumps(vol)}")
    known = {
        "image",
        "command",
        "entrypoint",
        "environment",
        "devices",
        "deploy",
        "shm_size",
        "ulimits",
        "stop_grace_period",
        "volumes",
    }
    dropped = sorted(set(svc) - known)
    if dropped:
        launch.notes.append(
            f"{where}: keys not imported (rigsmith sets them per target): "
            + ", ".join(f"{k}: {json.dumps(svc[k], ensure_ascii=False)}" for k in dropped)
        )
    return launch


def _compose_words(value: Any, where: str, launch: Launch) -> list[str]:
    if isinstance(value, list):
        out = []
        for idx, item in enumerate(value):
            if isinstance(item, str | int | float) and not isinstance(item, bool):
                out.append(_unescape(str(item)))
            else:
                launch.problems.append(f"{where}[{idx}]: must be a string, got {type(item).__name__}")
        return out
    if isinstance(value, str):
        script = shellwords.scan(_unescape(value))
        for p in script.problems:
            launch.problems.append(f"{where}: {p}")
        words = [w for c in script.commands for w in c.argv]
        return words
    launch.problems.append(f"{where}: must be a list or a string, got {type(value).__name__}")
    return []


def _compose_env(value: Any, where: str, launch: Launch) -> None:
    items: list[tuple[str, str | None]] = []
    if isinstance(value, list):
        for item in value:
            text = str(item)
            k, eq, v = text.partition("=")
            items.append((k, v if eq else None))
    elif isinstance(value, dict):
        items = [(str(k), None if v is None else str(v)) for k, v in value.items()]
    elif value is not None:
        launch.problems.append(f"{where}: must be a list or a mapping")
    for k, val in items:
        if not specmod.ENV_NAME_RE.match(k):
            launch.problems.append(f"{where}: {k!r} is not an environment variable name")
        elif val is None:
            launch.env.append(_passthrough(k, launch, where))
        else:
            launch.env.append(_env_var(k, _unescape(val), None, launch, where))
    launch.env = _merge_env(launch.env, launch)


def _compose_gpus(deploy: Any, where: str, launch: Launch) -> None:
    try:
        devices = deploy["resources"]["reservations"]["devices"]
    except (TypeError, KeyError):
        return
    for idx, dev in enumerate(devices or []):
        if not isinstance(dev, dict):
            continue
        ids = dev.get("device_ids")
        if dev.get("driver") == "cdi" and ids:
            launch.gpu_cdi = [*(launch.gpu_cdi or []), *map(str, ids)]
        elif ids:
            launch.gpu_indices = [str(x) for x in ids]
        elif isinstance(dev.get("count"), int):
            launch.gpu_count = dev["count"]
        elif dev.get("count") not in (None, "all"):
            launch.problems.append(f"{where}.resources.reservations.devices[{idx}].count: {dev['count']!r}")


def _duration(text: str, launch: Launch, where: str) -> int | None:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not m or not any(m.groups()):
        launch.problems.append(f"{where} {text!r}: not a duration (write it like 70s or 1m30s)")
        return None
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


# -- env string grammar (seed 003) -------------------------------------------------------------------

_ENV_TOKEN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=((?:<[^<>]*>|[^\s<])+)")


def parse_env_text(text: str) -> tuple[list[specmod.EnvVar], list[str], list[str]]:
    """The recipe's env string → (variables, env notes, problems).

    Grammar (seed 003): segments split by `` | ``; each holds ``NAME=value`` items separated by spaces
    (a value may contain ``<placeholder with spaces>``) and optional ``(annotation)``. An annotation of a
    one-variable segment is that variable's note; otherwise it is an env note. An ``Opt-in:`` tail holds
    ``;``-separated ``NAME=value description`` items, imported as opt-in variables that start disabled.
    """
    problems: list[str] = []
    notes: list[str] = []
    out: list[specmod.EnvVar] = []
    main, sep, tail = text.partition("Opt-in:")
    main = main.strip()
    if sep and main.endswith("."):
        main = main[:-1].rstrip()
    for idx, segment in enumerate(s for s in main.split(" | ") if s.strip()):
        annotations = [a.strip() for a in _parens(segment)]
        bare = _strip_parens(segment)
        found = _ENV_TOKEN_RE.findall(bare)
        leftover = _ENV_TOKEN_RE.sub("", bare).strip()
        if leftover:
            problems.append(
                f"env segment {idx + 1} ({segment.strip()!r}): cannot read {leftover!r}; write NAME=value"
            )
        note = "; ".join(annotations) if annotations and len(found) == 1 else None
        if annotations and len(found) != 1:
            notes.extend(annotations)
        for name, value in found:
            lifted = _secret_var(name, value, note, "env")
            if lifted is not None:
                notes.append(lifted[1])
            out.append(
                lifted[0]
                if lifted
                else specmod.EnvVar(
                    name=name, value=value, note=note, secret=bool(_SECRET_NAME_RE.search(name))
                )
            )
    if sep:
        items = [s.strip() for s in tail.split(";") if s.strip()]
        for idx, item in enumerate(items):
            if idx == len(items) - 1 and item.endswith("."):
                item = item[:-1].rstrip()
            m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=((?:<[^<>]*>|[^\s<])+)\s*(.*)$", item, re.DOTALL)
            if not m:
                problems.append(f"env Opt-in item {idx + 1} ({item!r}): write NAME=value description")
                continue
            name, value, note = m.group(1), m.group(2), m.group(3).strip() or None
            lifted = _secret_var(name, value, note, "env Opt-in", opt_in=True, enabled=False)
            if lifted is not None:
                notes.append(lifted[1])
            out.append(
                lifted[0]
                if lifted
                else specmod.EnvVar(
                    name=name,
                    value=value,
                    note=note,
                    opt_in=True,
                    enabled=False,
                    secret=bool(_SECRET_NAME_RE.search(name)),
                )
            )
    return out, notes, problems


def _annotation_spans(text: str) -> list[tuple[int, int]]:
    """Spans of ``(annotation)``: a ``(`` that starts a word (so ``$(id)`` in a value is not one)."""
    spans, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(" and (depth or i == 0 or text[i - 1].isspace()):
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans


def _parens(text: str) -> list[str]:
    return [text[a + 1 : b - 1] for a, b in _annotation_spans(text)]


def _strip_parens(text: str) -> str:
    out, last = [], 0
    for a, b in _annotation_spans(text):
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return "".join(out)


# -- notes -------------------------------------------------------------------------------------------


@dataclass
class NoteFacts:
    """What ``NOTE_FACTS`` found in the recipe notes."""

    repo: str | None = None
    revision: str | None = None
    local_dir: str | None = None
    size_bytes: int | None = None
    gpu_count: int | None = None
    gpu_model: str | None = None
    gpu_arch: str | None = None
    p2p: str | None = None
    nvlink: bool | None = None
    host_ram_gib: float | None = None
    disk_gib: float | None = None
    shm_size: str | None = None
    memlock: str | int | None = None
    stop_grace: int | None = None
    log_lines: list[str] = field(default_factory=list)
    kv_tokens: int | None = None
    startup: int | None = None
    warm: int | None = None
    patches: list[specmod.ConfigPatch] = field(default_factory=list)


def _upper_minutes(m: re.Match[str]) -> int:
    return int(m.group("hi") or m.group("lo")) * 60


def _note_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_FACT_READERS: Mapping[str, Callable[[NoteFacts, re.Match[str]], None]] = {
    "download": lambda f, m: _download(f, m),
    "gpus": lambda f, m: _gpu_fact(f, m),
    "p2p": lambda f, m: setattr(f, "p2p", m.group("p2p").lower()),
    "no_nvlink": lambda f, m: setattr(f, "nvlink", False),
    "host_ram": lambda f, m: setattr(f, "host_ram_gib", float(m.group("gb"))),
    "disk": lambda f, m: setattr(f, "disk_gib", float(m.group("gb"))),
    "shm": lambda f, m: setattr(f, "shm_size", m.group("size").lower()),
    "memlock": lambda f, m: setattr(
        f, "memlock", "unlimited" if m.group("memlock") in ("-1", "unlimited") else int(m.group("memlock"))
    ),
    "stop_grace": lambda f, m: setattr(f, "stop_grace", int(m.group("seconds"))),
    "ready": lambda f, m: f.log_lines.extend(re.findall(r"'([^']+)'", m.group("lines"))),
    "kv_tokens": lambda f, m: setattr(f, "kv_tokens", int(m.group("tokens").replace(",", ""))),
    "startup": lambda f, m: setattr(f, "startup", _upper_minutes(m)),
    "warm": lambda f, m: setattr(f, "warm", _upper_minutes(m)),
    "patch": lambda f, m: f.patches.append(
        specmod.ConfigPatch(
            key=f"{m.group('parent')}.{m.group('key')}",
            value=_note_value(m.group("value")),
            note=m.group("note"),
        )
    ),
}


def _download(f: NoteFacts, m: re.Match[str]) -> None:
    f.repo, f.revision, f.local_dir = m.group("repo"), m.group("rev") or m.group("rev2"), m.group("dir")
    if m.group("size"):
        f.size_bytes = int(float(m.group("size")) * _SIZE_UNITS[m.group("unit").upper()])


def _gpu_fact(f: NoteFacts, m: re.Match[str]) -> None:
    f.gpu_count, f.gpu_model = int(m.group("count")), m.group("model")
    f.gpu_arch = m.group("arch") or GPUS.get(f.gpu_model, (0.0, None))[1]


def note_facts(text: str) -> NoteFacts:
    """Read the structural facts out of recipe notes (first match of each pattern wins)."""
    facts = NoteFacts()
    for key, pattern in NOTE_FACTS:
        if key == "patch":
            for m in pattern.finditer(text):
                _FACT_READERS[key](facts, m)
            continue
        found = pattern.search(text)
        if found:
            _FACT_READERS[key](facts, found)
    return facts


# -- flags -------------------------------------------------------------------------------------------


def canonical_flag(token: str) -> str | None:
    """The canonical name of the vLLM flag (:mod:`rigsmith.importing.vllmflags`) ``token`` spells."""
    flag = vllmflags.lookup(token)
    return None if flag is None else flag.name


def flag_values(args: Sequence[str], canon: str) -> list[tuple[int, str]]:
    """Every (index of the value, value) given for ``canon`` in ``args``."""
    out = []
    for i, a in enumerate(args):
        if canonical_flag(a) != canon:
            continue
        if "=" in a:
            out.append((i, a.split("=", 1)[1]))
        elif i + 1 < len(args):
            out.append((i + 1, args[i + 1]))
    return out


def _json_problems(args: Sequence[str], notes: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        flag = name.replace("_", "-") if name.startswith("--") else name
        if flag not in JSON_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(args):
                out.append(f"args[{i}]: {a} needs a JSON value")
                continue
            val = args[i + 1]
        try:
            json.loads(val)
        except ValueError as err:
            if _LEGACY_KV_RE.fullmatch(val):
                # vLLM ≤ 0.8 took `k=v,k=v` here; rigsmith does not know the engine's version: pass it on.
                notes.append(
                    f"{flag} {val}: the key=value form of older vLLM releases (newer ones want JSON such as "
                    f"{json.dumps(_legacy_kv(val))}); passed through literally — check your engine's version"
                )
            else:
                out.append(f"{flag} takes JSON, but its value is not valid JSON ({err}): {val}")
    return out


_LEGACY_KV_RE = re.compile(r"[A-Za-z_][\w.-]*=[^,=]+(,[A-Za-z_][\w.-]*=[^,=]+)*")


def _legacy_kv(val: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in val.split(","):
        k, _, v = pair.partition("=")
        n = specmod.ascii_int(v)
        out[k] = n if n is not None else v
    return out


_NUMBER_FLAGS = vllmflags.NUMBER_FLAGS


def _number_problems(args: Sequence[str]) -> list[str]:
    """Numbers written in non-ASCII digits (``-tp ²``, ``--port ٨٠``): vLLM refuses them, and ``int()``
    would read some and crash on others, so the import refuses them naming the flag."""
    out = []
    for i, a in enumerate(args):
        flag = canonical_flag(a) or policy.vllm_flag_name(a)
        if flag not in _NUMBER_FLAGS:
            continue
        _, eq, value = a.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if any(not ch.isascii() and (ch.isdigit() or ch.isnumeric()) for ch in value):
            out.append(
                f"args[{i}]: {flag} {value!r} is not a whole number in ASCII digits (0-9), which vLLM "
                "needs; write it with 0-9"
            )
    return out


# -- Launch + Meta → Deployment ----------------------------------------------------------------------


def slug(text: str) -> str:
    """``text`` as a deployment name matching spec.NAME_RE (lowercase, max 63)."""
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower())
    s = re.sub(r"-{2,}", "-", s).lstrip("-._")
    return s[:63].rstrip("-._") or "recipe"


def _expands(launch: Launch, idx: int) -> bool:
    """Whether a shell would expand part of args[idx] (compose lists never do: interpolation is refused)."""
    return idx < len(launch.arg_expands) and launch.arg_expands[idx]


@dataclass(frozen=True)
class _Model:
    """Where the model comes from: a Hub repo (downloaded) or a checkpoint already on disk (repo None)."""

    repo: str | None
    local_dir: str
    arg: int
    note: str | None = None
    #: Hub file patterns to fetch (a GGUF quantization); empty: the whole repo.
    allow_patterns: tuple[str, ...] = ()
    #: The container path when the model word is exactly a volume's container path.
    container_path: str | None = None


#: Documentation placeholders written as paths (``/path/to/model``); refused like ``<placeholder>``.
_DOC_PATH_RE = re.compile(r"(^|/)path/to(/|$)")
#: A bind mount's host side that is the directory the recipe ran in.
_GGUF_REF_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*):([A-Za-z0-9_.-]+)$")
_CWD_RE = re.compile(r"^(\$\(pwd\)|`pwd`|\$PWD|\$\{PWD\}|\.)(?=/|$)")


def _model(launch: Launch, facts: NoteFacts, problems: list[str]) -> _Model | None:
    """The model argument as a Hub repo or a local checkpoint, or None with the reason in problems."""
    args = launch.args
    picks = flag_values(args, "--model")
    if picks:
        idx, value = picks[-1]
    elif launch.first_arg_positional_ok and (pos := vllmflags.positionals(args)):
        # vLLM's MODEL positional may follow options (`vllm serve --host 0.0.0.0 M`).
        idx, value = pos[0], args[pos[0]]
    else:
        guessed = [
            a
            for i, a in enumerate(args[:-1])
            if vllmflags.lookup(a) is None
            and vllmflags.is_option(a)
            and "=" not in a
            and not vllmflags.is_option(args[i + 1])
        ]
        why = (
            f" ({guessed[-1]} is a flag rigsmith does not know, so the word after it was read as its value; "
            "if that word is the model, write it right after the subcommand)"
            if guessed and launch.first_arg_positional_ok
            else ""
        )
        problems.append(f"the command names no model (no positional MODEL and no --model){why}; add one")
        return None
    if value in ("...", "…") or re.fullmatch(r"\.{3,}", value):
        problems.append(
            f"the model is {value!r}, a placeholder in the published text; replace it with the Hub repo id "
            "(owner/name) or the checkpoint's directory and import again"
        )
        return None
    if specmod.PLACEHOLDER_RE.fullmatch(value):
        problems.append(
            f"the model is the placeholder {value!r}; replace it with a Hub repo id (owner/name) or the "
            "checkpoint's directory"
        )
        return None
    if _expands(launch, idx):
        problems.append(
            f"the model is {value!r}, which a shell would expand from a variable; rigsmith cannot know the "
            "value — write the Hub repo id (owner/name) or the checkpoint's directory instead"
        )
        return None
    if _DOC_PATH_RE.search(value):
        problems.append(
            f"the model is {value!r}, a documentation placeholder path (/path/to/…); write the checkpoint's "
            "real directory or the Hub repo id (owner/name)"
        )
        return None
    gguf = _GGUF_REF_RE.match(value)
    if gguf and not value.startswith(("/", "~", ".")):
        # vLLM reads `owner/repo:QUANT` as the Hub repo and the GGUF file of that quantization.
        repo_id, quant = gguf.group(1), gguf.group(2)
        return _Model(
            repo_id,
            f"~/models/{PurePosixPath(repo_id).name}",
            idx,
            f"the model {value!r} is the Hub repo {repo_id} with the GGUF quantization {quant} "
            f"(only the files matching *{quant}*.gguf are fetched); vLLM loads a GGUF file, so once "
            "fetch-model has run, point the model argument at the .gguf file under model.container_path",
            allow_patterns=(f"*{quant}*.gguf", f"*{quant}*/*.gguf"),
        )
    is_path = value.startswith(("/", "~", "./", "../")) or not _REPO_RE.match(value)
    if not is_path:
        if facts.repo == value and facts.local_dir:
            return _Model(value, facts.local_dir, idx)
        return _Model(value, f"~/models/{PurePosixPath(value).name}", idx)
    if facts.repo and (facts.local_dir is None or facts.local_dir.rstrip("/") == value.rstrip("/")):
        return _Model(facts.repo, value, idx)
    if facts.repo and facts.local_dir and value.startswith("/"):
        # The notes' download names the repo, revision and host directory; the served path is where the
        # engine sees it (a container path), so that is where the download is mounted.
        return _Model(
            facts.repo,
            facts.local_dir,
            idx,
            f"the notes download {facts.repo} to {facts.local_dir} and the command serves {value}: "
            f"model.local_dir is the download, mounted at model.container_path {value}",
            container_path=value.rstrip("/"),
        )
    return _local_model(launch, value, idx, problems)


def _local_model(launch: Launch, value: str, idx: int, problems: list[str]) -> _Model | None:
    """A model path with no Hub repo: a checkpoint already on disk, mounted but never fetched."""
    if launch.image is None:
        if value.startswith("~") and not (value == "~" or value.startswith("~/")):
            problems.append(f"the model is {value!r}; write ~/… or an absolute path (~user is not expanded)")
            return None
        if value.startswith(("/", "~")):
            return _Model(None, value, idx)
        # vLLM loads a local directory of that name (relative to its cwd) before it asks the Hub.
        rel = value if value.startswith(("./", "../")) else "./" + value
        return _Model(
            None,
            rel,
            idx,
            f"the model {value!r} is a directory relative to where the recipe ran; model.local_dir is "
            f"{rel!r} until you set its absolute path (deploy refuses a relative one)",
        )
    # A container recipe: the path is inside the container; a bind mount says where it is on the host.
    path = PurePosixPath(value)
    if not path.is_absolute():
        problems.append(
            f"the model is {value!r}, a path relative to the container's working directory; write an "
            "absolute path under a mounted volume"
        )
        return None
    covering = [m for m in launch.mounts if path.is_relative_to(m.container)]
    if not covering:
        problems.append(
            f"the model is the container path {value!r} and no volume of the recipe mounts it from the host; "
            "add the bind mount (-v HOSTDIR:CONTAINERDIR) that holds the checkpoint"
        )
        return None
    mount = max(covering, key=lambda m: len(PurePosixPath(m.container).parts))
    host = _CWD_RE.sub(".", mount.host)
    if "$" in host or "`" in host:
        problems.append(
            f"the model is {value!r}, inside the volume {mount.host}:{mount.container} whose host side is "
            "shell syntax; write the host directory instead"
        )
        return None
    rest = path.relative_to(mount.container).as_posix()
    exact = value.rstrip("/") if rest == "." else None
    local = host.rstrip("/") + ("/" + rest if rest != "." else "") if host != "/" else "/" + rest
    note = (
        f"the model {value!r} is the container path of {local!r} (volume {mount.host}:{mount.container}); "
        "model.local_dir is that host directory"
    )
    if not local.startswith(("/", "~")):
        note += (
            ", relative to where the recipe ran, until you set its absolute path (deploy refuses a "
            "relative one)"
        )
    return _Model(None, local, idx, note, container_path=exact)


def _gpus(launch: Launch, facts: NoteFacts, vendor: str, problems: list[str]) -> specmod.GpuSpec | None:
    """The GPU request, or None with the reason in problems (more GPUs than one node has)."""

    def size(canon: str) -> int:
        vals = flag_values(launch.args, canon)
        n = specmod.ascii_int(vals[-1][1]) if vals else None
        return 1 if n is None else n

    # One engine of TP × PP × PCP GPUs per data-parallel rank on this node (vllmflags.GPU_MULTIPLIERS).
    dp_local = bool(flag_values(launch.args, "--data-parallel-size-local"))
    parallel = 1
    for canon in vllmflags.GPU_MULTIPLIERS:
        if canon != ("--data-parallel-size" if dp_local else "--data-parallel-size-local"):
            parallel *= size(canon)
    pin_all = bool(launch.gpu_cdi) and any(c.endswith("=all") for c in launch.gpu_cdi or [])
    explicit = None if pin_all else launch.gpu_cdi or launch.gpu_indices
    count = len(explicit) if explicit else facts.gpu_count or launch.gpu_count or parallel
    if count > specmod.MAX_GPUS:
        # Checked before any CDI name is made: a count from the notes or -tp can be any size.
        problems.append(
            f"the recipe asks for {count} GPUs (from {_gpu_count_source(launch, facts, parallel)}); one node "
            f"gives a container at most {specmod.MAX_GPUS}: fix the number in the recipe"
        )
        return None
    if launch.gpu_cdi and not pin_all:
        cdi = tuple(launch.gpu_cdi)
    elif launch.gpu_cdi:
        # "=all" is pinned to 0..N-1 so every target carries the same explicit devices.
        vendor = launch.gpu_cdi[0].split("=", 1)[0]
        cdi = tuple(f"{vendor}={i}" for i in range(count))
    elif launch.gpu_indices:
        cdi = tuple(f"{vendor}={i}" for i in launch.gpu_indices)
    else:
        cdi = tuple(f"{vendor}={i}" for i in range(count))
    vram = GPUS.get(facts.gpu_model or "", (None, None))[0]
    return specmod.GpuSpec(
        count=count,
        model=facts.gpu_model,
        arch=facts.gpu_arch,
        vram_gib=vram,
        cdi_devices=cdi,
        p2p=facts.p2p or "unknown",
        nvlink=facts.nvlink,
    )


#: Variables that select GPUs by the host's numbering: CUDA's, ROCm's HIP/ROCR, and the NVIDIA container
#: runtime's (``docker run --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=0,1``).
_VISIBLE_DEVICES = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
#: Values that select no particular devices (every GPU, or none).
_NO_SELECTION = frozenset({"all", "none", "void", "-1", "NoDevFiles"})
_DEVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def _visible_devices(
    env: Sequence[specmod.EnvVar], launch: Launch, problems: list[str]
) -> list[specmod.EnvVar]:
    """``CUDA_VISIBLE_DEVICES=2,3`` on a host (or in a container that sees every GPU) picks GPUs 2 and 3:
    they become the CDI devices, and inside the container, which sees only those two as 0 and 1, the
    variable is renumbered ``0,1`` (left as ``2,3`` CUDA finds no device)."""
    out = list(env)
    if launch.gpu_indices or (launch.gpu_cdi and not all(c.endswith("=all") for c in launch.gpu_cdi)):
        return out  # the devices are chosen already; the variable counts in the container's numbering
    picked: list[str] | None = None
    for k, e in enumerate(out):
        if e.name not in _VISIBLE_DEVICES or e.secret or "$" in e.value or "<" in e.value:
            continue
        ids = [x.strip() for x in e.value.split(",")]
        if not all(_DEVICE_ID_RE.fullmatch(x) for x in ids) or _NO_SELECTION & set(ids):
            continue
        if picked is not None and picked != ids:
            problems.append(
                f"env: {e.name}={e.value} selects other GPUs than {','.join(picked)} chosen by another "
                "*_VISIBLE_DEVICES variable; keep one selection"
            )
            continue
        picked = ids
        renumbered = ",".join(str(i) for i in range(len(ids)))
        out[k] = e.model_copy(update={"value": renumbered})
        if renumbered != e.value:
            launch.notes.append(
                f"{e.name}={e.value} selects the host's GPUs {e.value}: they are the CDI devices, and inside "
                f"the container (which sees them as 0..{len(ids) - 1}) the variable is {renumbered}"
            )
    if picked is not None:
        launch.gpu_indices = picked
        launch.gpu_cdi = None
    return out


def _gpu_count_source(launch: Launch, facts: NoteFacts, parallel: int) -> str:
    if launch.gpu_cdi or launch.gpu_indices:
        return "its device list"
    if facts.gpu_count:
        return "the notes"
    if launch.gpu_count:
        return "--gpus or the compose device count"
    return f"the parallel sizes, {parallel} in all"


def _vendor(env: Sequence[specmod.EnvVar]) -> str:
    for e in env:
        for pattern, vendor in GPU_VENDOR_HINTS:
            if pattern.match(e.name):
                return vendor
    return DEFAULT_GPU_VENDOR


def _placeholders(texts: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for t in texts:
        for tok in specmod.PLACEHOLDER_RE.findall(t):
            out.setdefault(tok, None)
    return out


def _secondary_models(launch: Launch, main: _Model, notes: list[str]) -> list[dict[str, Any]]:
    """The Hub models the args name besides the main one (vllmflags ``model_ref``): a draft model in
    ``--speculative-config`` (or the older ``--speculative-model``), ``--tokenizer``, ``--lora-modules``.
    A local path is left as written (it must be mounted; noted)."""
    found: list[dict[str, Any]] = []
    args = launch.args

    def add(role: str, value: str, idx: int, name: str | None = None) -> None:
        if _expands(launch, idx) or specmod.PLACEHOLDER_RE.search(value):
            return
        if _REPO_RE.match(value) and not value.startswith(("/", "~", ".")):
            found.append({"role": role, "repo": value, "name": name, "arg": idx})
        elif value.startswith(("/", "~")):
            notes.append(
                f"args[{idx}] {value!r} ({role}) is a local path: mount it into the container and fix "
                "the path"
            )

    i = 0
    while i < len(args):
        flag = vllmflags.lookup(args[i])
        end = vllmflags.span(args, i) if vllmflags.is_option(args[i]) else i + 1
        if flag is None or flag.model_ref in (None, "model") or i == main.arg:
            i = end
            continue
        if "=" in args[i]:
            values = [(i, args[i].split("=", 1)[1])]
        else:
            values = [(k, args[k]) for k in range(i + 1, end)]
        for k, v in values:
            if flag.model_ref == "speculative" and flag.kind == "json":
                try:
                    conf = json.loads(v)
                except ValueError:
                    continue
                if isinstance(conf, dict) and isinstance(conf.get("model"), str):
                    add("speculative", conf["model"], k)
            elif flag.model_ref == "lora":
                name, path = _lora_module(v)
                if path is not None:
                    add("lora", path, k, name)
            elif flag.model_ref is not None:
                add(flag.model_ref, v, k)
        i = end
    if found:
        notes.append(
            "secondary_models lists the Hub models the engine loads besides the main one "
            f"({', '.join(f['repo'] for f in found)}); the engine downloads them from the Hub at start "
            "unless "
            "they are fetched and mounted"
        )
    return found


def _lora_module(value: str) -> tuple[str | None, str | None]:
    """``NAME=PATH`` or the JSON form ``{"name": …, "path": …}`` of one ``--lora-modules`` value."""
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except ValueError:
            return None, None
        if isinstance(data, dict) and isinstance(data.get("path"), str):
            name = data.get("name")
            return (name if isinstance(name, str) else None), data["path"]
        return None, None
    name, eq, path = value.partition("=")
    return (name, path) if eq else (None, None)


def _lift_secret_flags(launch: Launch, problems: list[str]) -> list[specmod.EnvVar]:
    """``--api-key VALUE`` / ``--hf-token VALUE`` in any spelling vLLM's parser accepts (``--api_key``,
    ``--api-key=V``, ``--api-ke V``; :func:`rigsmith.policy.secret_flag`): the value never enters the spec (it
    would be written into deployments/NAME.yaml and every artifact); vLLM reads the same secret from an
    environment variable, which every target passes by name. Removes the flag and its values from
    ``launch.args``; an ambiguous abbreviation is removed too and refused (vLLM refuses it)."""
    lifted: list[specmod.EnvVar] = []
    # Removing a flag and its values joins its neighbours (`--hf-token --hf-token S V`: the bare one now
    # takes V), so lift until nothing changes.
    while True:
        found = _lift_once(launch, problems)
        if not found:
            return lifted
        lifted += found


def _lift_once(launch: Launch, problems: list[str]) -> list[specmod.EnvVar]:
    lifted: list[specmod.EnvVar] = []
    keep: list[int] = []
    i = 0
    while i < len(launch.args):
        a = launch.args[i]
        match = policy.secret_flag(a)
        j = policy.secret_flag_span(launch.args, i)
        if match is None or (j == i + 1 and "=" not in a and not match.ambiguous):
            # Not a secret flag, or a bare --hf-token (vLLM: use the stored login), nothing secret.
            keep.append(i)
            i += 1
            continue
        spelled = a.split("=", 1)[0]
        if match.ambiguous:
            problems.append(
                f"args: {spelled} abbreviates {', '.join((match.flag, *match.ambiguous))}, which vLLM "
                "refuses as ambiguous (and it may carry a secret); write the full flag name"
            )
        var = match.variable
        launch.notes.append(
            f"{spelled} ({match.flag}) and its value were removed from the args (a secret is never stored in "
            f"the spec); vLLM reads it from {var}: export it (or use a 0600 env file / podman secret) before "
            "starting"
        )
        lifted.append(specmod.EnvVar(name=var, value="", secret=True, note=f"lifted from {match.flag}"))
        launch.secrets += [a.split("=", 1)[1]] if "=" in a else launch.args[i + 1 : j]
        i = j
    launch.args = [launch.args[k] for k in keep]
    launch.arg_expands = [launch.arg_expands[k] for k in keep if k < len(launch.arg_expands)]
    return lifted


#: Token shapes that are secrets wherever they appear (Hugging Face user tokens, OpenAI-style keys).
_TOKEN_SHAPE_RE = re.compile(r"(?<![A-Za-z0-9_-])(hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,})")


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every lifted secret, and every token-shaped word, replaced by ``<redacted>``: the
    recipe's comments and notes (kept verbatim) would otherwise carry what the args and env lost."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "<redacted>")
        return _TOKEN_SHAPE_RE.sub("<redacted>", value)
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secrets) for v in value]
    return value


def _read_only_mounts(launch: Launch, model_path: str | None) -> list[str]:
    """Mount the recipe's model and Hub-cache volumes read-only unless it wrote ``:rw``, and say so.

    The container serves the checkpoint rigsmith fetched and locked (or the one already on disk); a
    writable model or cache mount would let the engine, or anything running in it, change those files.
    ``model_path`` is the container path of a local model (None for a Hub model).
    """
    notes = []
    for i, m in enumerate(launch.mounts):
        if m.readonly or m.container in launch.writable:
            continue
        holds_model = model_path is not None and PurePosixPath(model_path).is_relative_to(m.container)
        cache = "huggingface" in PurePosixPath(m.container).parts
        if holds_model or cache:
            launch.mounts[i] = m.model_copy(update={"readonly": True})
            what = "holds the model" if holds_model else "is the Hub cache"
            notes.append(
                f"the volume {m.host}:{m.container} {what}, so it is mounted read-only (the recipe did not "
                f"write :rw); set mounts[{i}].readonly: false if the engine must write there"
            )
    return notes


def build(
    launch: Launch,
    meta: Meta,
    *,
    source: str,
    name: str | None = None,
    image: str | None = None,
) -> specmod.Deployment:
    """Assemble and validate the Deployment; every problem found so far (and here) in one RecipeError."""
    problems = list(launch.problems)
    notes: list[str] = []
    env_notes: list[str] = []
    env = list(launch.env)
    if meta.env_text:
        more, more_notes, more_problems = parse_env_text(meta.env_text)
        env = [*more, *env]
        env_notes += more_notes
        problems += more_problems
    if meta.env_map:
        for k, v in meta.env_map.items():
            if not specmod.ENV_NAME_RE.match(k):
                problems.append(f"env: {k!r} is not an environment variable name")
            else:
                env.append(
                    _passthrough(k, launch, "env") if v is None else _env_var(k, v, None, launch, "env")
                )
    env = _merge_env([*env, *_lift_secret_flags(launch, problems)], launch)
    problems += [
        f"the entrypoint holds {w.split('=', 1)[0]} ({sf.flag}), a secret flag; move it and its value to "
        f"the command (import then passes the secret as {sf.variable} by name) or remove it"
        for w in launch.subcommand
        if (sf := policy.secret_flag(w)) is not None
    ]
    facts = note_facts(meta.notes_text or "")
    problems += _json_problems(launch.args, launch.notes) + _number_problems(launch.args)
    # Every problem at once: the model is checked even when the text had others, unless the launch
    # command itself was not understood (then its args are not vLLM's).
    model_problems: list[str] = []
    model = _model(launch, facts, model_problems) if launch.args or not launch.problems else None
    problems += [p for p in model_problems if not (launch.problems and "names no model" in p)]
    if name is not None and not specmod.NAME_RE.match(name):
        problems.append(
            f"--name {name!r}: use lowercase letters, digits, '.', '_' or '-' (max 63), starting with a "
            "letter or digit"
        )
    if image is not None and (not image.strip() or any(ch.isspace() for ch in image)):
        problems.append(f"--image {image!r}: not an image reference (e.g. localhost/vllm:1 or name@sha256:…)")
    env = _visible_devices(env, launch, problems)
    if launch.image_expands and image is None:
        problems.append(
            f"engine.image: the recipe's image {launch.image} is a shell variable whose value rigsmith "
            "cannot know; import again with --image REF (e.g. vllm/vllm-openai:v0.11.0) or write the image "
            "in the recipe"
        )
    gpus = _gpus(launch, facts, launch.gpu_vendor or _vendor(env), problems)
    if problems or model is None or gpus is None:
        raise _refuse(source, problems or ["no model"])
    repo, local_dir, model_idx = model.repo, model.local_dir, model.arg
    for i, a in enumerate(launch.args):
        if _expands(launch, i):
            notes.append(f"args[{i}] {a!r} holds shell syntax that a shell would expand; kept literally")
    model_value = flag_values([launch.args[model_idx]], "--model") or [(model_idx, launch.args[model_idx])]
    if repo is not None and model_value[0][1] == repo:
        notes.append(
            f"the model argument {repo} is replaced by the downloaded copy at model.container_path; "
            "set --served-model-name if clients must see the repo id"
        )
    if repo is None:
        notes.append(
            "model.repo is null: the checkpoint is already on disk at model.local_dir, mounted read-only at "
            "model.container_path; rigsmith downloads, pins and verifies nothing for it"
        )
    if model.note:
        notes.append(model.note)
    for i, a in enumerate(launch.args):
        if a.startswith("./") and i != model_idx:
            notes.append(
                f"args[{i}] {a!r} is a path relative to where the recipe ran; mount it and fix the path"
            )
    notes += _read_only_mounts(launch, model_value[0][1] if repo is None else None)
    basename = PurePosixPath(local_dir.rstrip("/")).name or PurePosixPath(repo or "model").name
    container_path = model.container_path or f"/models/{basename}"
    if model.container_path is not None:
        # The recipe's own volume is the model mount (`-v /srv/m:/models/m ... --model /models/m`).
        launch.mounts = [m for m in launch.mounts if m.container.rstrip("/") != model.container_path]
    final_image = image or launch.image
    if image and launch.image and image != launch.image:
        notes.append(f"the recipe's image {launch.image} was replaced by --image {image}")
    network: dict[str, Any] = {}
    hosts = flag_values(launch.args, "--host")
    ports = flag_values(launch.args, "--port")
    if hosts:
        network["host"] = hosts[-1][1]
    if ports:
        if (port := specmod.ascii_int(ports[-1][1])) is not None:
            network["port"] = port
        else:
            notes.append(f"--port {ports[-1][1]} is not a number; network.port stays 8000 until you set it")
    revision = flag_values(launch.args, "--revision")
    cluster, node_tokens, cluster_notes = (
        multinode.cluster_data(launch.node_args, launch.gpu_vendor or _vendor(env))
        if launch.node_args
        else (None, [], [])
    )
    notes += cluster_notes
    secondary = _secondary_models(launch, model, notes)
    all_notes = [*([meta.notes_text] if meta.notes_text else []), *launch.notes, *notes]
    data: dict[str, Any] = {
        "name": name
        or slug(meta.recipe_id or meta.title or (PurePosixPath(repo).name if repo else basename)),
        "description": meta.title,
        "model": {
            "repo": repo,
            "revision": revision[-1][1] if revision else (facts.revision if repo == facts.repo else None),
            "local_dir": local_dir,
            "container_path": container_path,
            "allow_patterns": list(model.allow_patterns),
            "size_bytes": facts.size_bytes,
            "config_patches": [p.model_dump(exclude_defaults=True) for p in facts.patches],
        },
        "secondary_models": secondary,
        "engine": {
            "image": final_image,
            "recipe_executable": launch.recipe_executable,
            "executable": launch.executable,
            "subcommand": list(launch.subcommand),
            "args": launch.args,
            "model_arg": model_idx,
        },
        "env": [e.model_dump() for e in env],
        "env_notes": env_notes,
        "placeholders": _placeholders([*launch.args, *(e.value for e in env), *node_tokens]),
        "resources": {
            "gpus": gpus.model_dump(),
            "host_ram_gib": facts.host_ram_gib,
            "disk_gib": facts.disk_gib,
            **({"shm_size": s} if (s := launch.shm_size or facts.shm_size) else {}),
            **(
                {"memlock": m}
                if (m := launch.memlock if launch.memlock is not None else facts.memlock)
                else {}
            ),
            **({"stop_grace_seconds": g} if (g := launch.stop_grace or facts.stop_grace) else {}),
        },
        "readiness": {
            **({"log_lines": ln} if (ln := [x for x in facts.log_lines if "KV cache" not in x]) else {}),
            "kv_cache_tokens": facts.kv_tokens,
            **({"startup_seconds": facts.startup} if facts.startup else {}),
            "warm_startup_seconds": facts.warm,
        },
        "network": network,
        "mounts": [m.model_dump() for m in launch.mounts],
        "notes": all_notes,
        **({"cluster": cluster} if cluster else {}),
    }
    secrets = [*launch.secrets]
    if meta.env_text:
        secrets += [v for n, v in _ENV_TOKEN_RE.findall(meta.env_text) if _SECRET_NAME_RE.search(n)]
    # Free text only: the argv and values are exact (and already secret-free), a short key could be a word.
    scrub = sorted({v for v in secrets if len(v) >= 4 and "$" not in v}, key=len, reverse=True)
    for key in ("description", "notes", "env_notes"):
        data[key] = _scrub(data[key], scrub)
    for e in data["env"]:
        e["note"] = _scrub(e["note"], scrub)
    data["provenance"] = meta.provenance.model_dump() if meta.provenance else None
    if data["provenance"]:
        data["provenance"]["title"] = _scrub(data["provenance"]["title"], scrub)
    nul = specmod.nul_paths(data)
    if nul:
        # A JSON "\u0000" or a YAML "\0" escape: the raw text had none.
        raise _refuse(
            source, [f"{p}: holds a NUL character, which no target can carry; remove it" for p in nul]
        )
    try:
        return specmod.Deployment.model_validate(data)
    except ValidationError as err:
        raise _refuse(source, [f"{p}: {m}" for p, m in specmod.problems_from(err)]) from None
