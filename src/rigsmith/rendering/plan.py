"""From spec + lock to a RunPlan: the target-independent facts every artifact carries.

Every target renders from a RunPlan, so GPU devices, shm, memlock, stop grace, env, mounts, argv and
readiness are decided once, here. Pure: no filesystem, no engine, no network.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from rigsmith import secondary, userhome
from rigsmith import spec as specmod
from rigsmith.errors import LockError, RigsmithError, SpecError
from rigsmith.imageref import image_problem
from rigsmith.policy import SECRET_FLAGS as SECRET_FLAGS  # re-exported for the targets
from rigsmith.policy import dangerous_mounts, secret_flag, secret_flag_span
from rigsmith.render import breaks_line
from rigsmith.rendering import decisions, optins
from rigsmith.rendering.envpaths import EnvPath, env_paths, unprovided
from rigsmith.rendering.pathmounts import filled_paths
from rigsmith.resolving.lock import lock as lockmod

#: What rigsmith.lock pins for the deployment (``RunPlan.lock_sha256``, first 16 hex digits) and the history
#: entry it came in with: every container rigsmith starts carries both, so ``status`` (and a user with
#: ``podman inspect``) can tell which lock it runs; ``up`` refuses a cluster node running another lock.
LOCK_LABEL = "io.rigsmith.lock-sha256"
LOCK_ENTRY_LABEL = "io.rigsmith.lock-entry"


@dataclass(frozen=True)
class PlanMount:
    """A bind mount, host path as the user wrote it (``~/`` allowed)."""

    host: str
    container: str
    readonly: bool
    kind: Literal["dir", "file"]
    sparse_size: int | None = None
    role: Literal["model", "extra", "secondary"] = "extra"
    #: A secondary model's spec field (``secondary_models[I]``), for messages.
    field: str = ""


@dataclass(frozen=True)
class RunPlan:
    """What any target must express for one deployment."""

    name: str
    spec_path: str
    image: str
    image_pinned: bool
    entrypoint: str
    command: tuple[str, ...]
    devices: tuple[str, ...]
    gpu_indices: tuple[str, ...]
    shm_size: str
    shm_bytes: int
    memlock: Literal["unlimited", "host"] | int
    stop_timeout: int
    shutdown_timeout: int | None
    env: tuple[tuple[str, str], ...]
    secret_env: tuple[str, ...]
    mounts: tuple[PlanMount, ...]
    network_mode: Literal["host", "none"]
    host: str
    port: int
    health_path: str
    log_lines: tuple[str, ...]
    kv_cache_tokens: int | None
    startup_seconds: int
    spec_sha256: str
    labels: tuple[tuple[str, str], ...] = field(default=())
    #: ``container``: ``image`` runs ``entrypoint`` + ``command``. ``venv``: no image; ``venv``/bin/vllm runs
    #: ``command``, whose model word (``model_word``, an index) is the host path (``~/`` allowed).
    runtime: Literal["container", "venv"] = "container"
    venv: str | None = None
    model_word: int | None = None
    #: Container paths the env names through a placeholder, each with what provides it (mount / image).
    env_paths: tuple[EnvPath, ...] = ()
    #: Indices in ``command`` of the words naming a secondary model (venv: its host path, ``~/`` allowed).
    secondary_words: tuple[int, ...] = ()
    #: Secrets read from a host variable of another name (``NAME=$OTHER``): (NAME, OTHER).
    secret_from: tuple[tuple[str, str], ...] = ()
    #: sha256 of what rigsmith.lock pins for this deployment (the image reference, the model and secondary
    #: snapshots); a multi-node deployment labels every node's container with it (``lock_digest``).
    lock_sha256: str = ""

    def secret_source(self, name: str) -> str:
        """The host variable (or podman/kube secret key) the secret ``name`` is read from."""
        return dict(self.secret_from).get(name, name)

    @property
    def base_url(self) -> str:
        """Where the OpenAI API answers from this host."""
        return local_url(self.host, self.port)

    @property
    def health_url(self) -> str:
        return self.base_url + self.health_path

    def check_env_paths(self) -> None:
        """Refuse env paths (through a placeholder) that no mount and not the built image provide, naming
        each variable and its note; deploy calls it after the target rendered (its refusals come first)."""
        problems = unprovided(self.env_paths)
        if problems:
            raise SpecError(self.spec_path, problems)

    @property
    def memlock_ulimit(self) -> str | None:
        """podman ``--ulimit`` value; None when the runtime's own limit is kept (memlock: host)."""
        if self.memlock == "host":
            return None
        v = "-1" if self.memlock == "unlimited" else str(self.memlock)
        return f"memlock={v}:{v}"

    def podman_options(self) -> list[str]:
        """``podman run`` options (everything between ``run`` and the image), as argv.

        The podman target writes exactly these; the quadlet, compose and kube tests compare the argv
        their real consumers produce against them.
        """
        opts = ["--name", self.name, "--init", "--network", self.network_mode]
        for d in self.devices:
            opts += ["--device", d]
        opts += ["--shm-size", self.shm_size]
        if self.memlock_ulimit:
            opts += ["--ulimit", self.memlock_ulimit]
        opts += ["--stop-timeout", str(self.stop_timeout)]
        for k, v in self.labels:
            opts += ["--label", f"{k}={v}"]
        for k, v in self.env:
            opts += ["--env", f"{k}={v}"]
        for k in self.secret_env:
            opts += ["--env", k]
        opts += ["--entrypoint", self.entrypoint]
        return opts


def local_url(host: str, port: int) -> str:
    """The URL of a server bound to ``host``:``port``, reached from the same host: a wildcard bind is
    reached on loopback. The one copy of that rule (status, wait, bench and the proxy entry use it)."""
    host = reach_host(host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def reach_host(host: str) -> str:
    """The address a client on the same host calls a server bound to ``host`` on (a wildcard: loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _image_problems(spec: specmod.Deployment, override: str | None) -> list[tuple[str, str]]:
    """The image reference a container plan runs must be one (:func:`image_problem`)."""
    ref = override or spec.engine.image
    why = image_problem(ref) if ref else None
    return [("--image" if override else "engine.image", why)] if why else []


def resolve_image(spec: specmod.Deployment, lock: lockmod.Lock, override: str | None) -> tuple[str, bool]:
    """(image reference, pinned by digest) a container plan runs; ``("", False)`` for a venv plan.

    Raises:
        LockError: the spec runs an image build the lock has no entry for.
        RigsmithError: the spec names no image at all.
    """
    if spec.engine.runtime == "venv":
        return "", False
    ref = override or spec.engine.image
    if ref:
        if "@sha256:" in ref:
            return ref, True
        locked = lock.images.get(ref)
        if locked:
            return f"{ref.rsplit(':', 1)[0] if _has_tag(ref) else ref}@{locked.digest}", True
        return ref, False
    if spec.engine.build:
        built = lock.builds.get(spec.engine.build)
        if built is None:
            raise LockError(
                f"deployment {spec.name!r} runs image build {spec.engine.build!r}, which has no entry in "
                "rigsmith.lock",
                hint=f"`invoke build --deployment {spec.name}` builds it (deploy and up also take --image "
                "REF to run another image)",
            )
        return built.pinned_ref, True  # a registry digest after a push, else the local image ID: content
    raise RigsmithError(
        f"deployment {spec.name!r} names no container image (engine.image and engine.build are empty; "
        f"{spec.why_no_image()})",
        hint="pass --image REF to deploy (or import-recipe), set engine.image in the spec, "
        "or set engine.build to an images/<name> definition and run `invoke build`",
    )


def _venv_problems(spec: specmod.Deployment, override: str | None) -> list[tuple[str, str]]:
    """A venv engine names its venv (absolute, inside the CT) and no image."""
    problems = []
    venv = spec.engine.venv
    if not venv:
        problems.append(
            ("engine.venv", "runtime is venv but no venv is set; set the venv's absolute path inside the CT")
        )
    elif not venv.startswith("/") or breaks_line(venv) or re.search(r"[\s\\%$]", venv):
        problems.append(
            (
                "engine.venv",
                f"{venv!r} must be an absolute path (inside the CT) with no whitespace, control character, "
                "backslash, '%' or '$'",
            )
        )
    for fld, value in (
        ("engine.image", spec.engine.image),
        ("engine.build", spec.engine.build),
        ("--image", override),
    ):
        if value:
            problems.append(
                (
                    fld,
                    f"runtime is venv, which runs no image; remove {value!r} "
                    "or set engine.runtime: container",
                )
            )
    return problems


def _secret_args(args: tuple[str, ...], where: str = "engine.args") -> list[tuple[str, str]]:
    """Problems for secret flag values in the argv, which every target would write into its files."""
    out = []
    for i, a in enumerate(args):
        match = secret_flag(a)
        if match is None:
            continue
        if match.ambiguous:
            out.append(
                (
                    f"{where}[{i}]",
                    f"{a.split('=', 1)[0]} abbreviates {', '.join((match.flag, *match.ambiguous))}, which "
                    "vLLM refuses as ambiguous; write the full flag name",
                )
            )
        elif secret_flag_span(args, i) > i + 1 or "=" in a:
            out.append(
                (
                    f"{where}[{i}]",
                    f"{a.split('=', 1)[0]} ({match.flag}) carries a secret, which would be written into "
                    f"every generated file; remove the flag and its value and add env {match.variable} with "
                    "secret: true (podman secret or a 0600 env file supplies it)",
                )
            )
    return out


def _relative_hosts(spec: specmod.Deployment) -> list[tuple[str, str]]:
    """Host paths that are neither absolute nor under ``~/``.

    Each target would resolve them against something else (run.sh: the shell's cwd; quadlet: the unit's
    directory; compose: the compose file's; podman reads a bare word as a named volume; kube and PVE
    refuse them), so the same spec would mount different directories.
    """
    hosts = [("model.local_dir", spec.model.local_dir, "the checkpoint's")]
    # A host path holding a placeholder still to fill is named by fill_problems, not here.
    filled = [(i, spec.fill(m.host)) for i, m in enumerate(spec.mounts)]
    hosts += [
        (f"mounts[{i}].host", host, "the host directory's")
        for i, host in filled
        if not specmod.PLACEHOLDER_RE.search(host)
    ]
    out = [
        (fld, f"{host!r} is relative (to where the recipe ran); set {what} absolute path or ~/…")
        for fld, host, what in hosts
        if not (host.startswith("/") or host == "~" or host.startswith("~/"))
    ]
    out += [
        (f"mounts[{i}].host", f"{m.host!r} ends in '/', but kind: file mounts a file; name the file")
        for i, m in enumerate(spec.mounts)
        if m.kind == "file" and (m.host.endswith("/") or m.host == "~")
    ]
    return out


def _nul_problems(data: object, path: str = "") -> list[tuple[str, str]]:
    """Every spec string holding a NUL, by field path. No target can carry one: bash drops it from run.sh,
    quadlet drops every engine argument of the unit, podman-compose crashes, and no argv or environment
    can hold it."""
    if isinstance(data, str):
        if "\0" in data:
            return [(path, f"{data!r} holds a NUL character, which no target can write; remove it")]
        return []
    if isinstance(data, dict):
        return [
            p
            for k, v in data.items()
            for p in _nul_problems(k, path) + _nul_problems(v, f"{path}.{k}".lstrip("."))
        ]
    if isinstance(data, list | tuple):
        return [p for i, v in enumerate(data) for p in _nul_problems(v, f"{path}[{i}]")]
    return []


def _has_tag(ref: str) -> bool:
    last = ref.rsplit("/", 1)[-1]
    return ":" in last


def _shutdown_problems(spec: specmod.Deployment) -> list[tuple[str, str]]:
    grace, shutdown = spec.resources.stop_grace_seconds, spec.shutdown_timeout
    if shutdown is None or shutdown < grace:
        return []
    return [
        (
            "resources.stop_grace_seconds",
            f"is {grace}s but vLLM --shutdown-timeout is {shutdown}s; the container would be killed "
            f"mid-drain. Set it above {shutdown} (e.g. {shutdown + 10})",
        )
    ]


def problems(spec: specmod.Deployment, image: str | None = None) -> list[tuple[str, str]]:
    """Every reason no target could render this spec (with ``--image``), by field path, none raised.

    Unfilled placeholders, NUL characters, secret flag values, relative or dangerous host paths, an empty
    executable, the venv or image settings of the runtime, and stop timeouts that do not nest.
    """
    out = spec.fill_problems()
    out += _nul_problems(spec.model_dump(mode="python")) + _nul_problems(image, "--image")
    out += _secret_args(spec.engine.subcommand, "engine.subcommand") + _secret_args(spec.engine.args)
    out += (
        _relative_hosts(spec) + dangerous_mounts(spec) + list(optins.apply(spec, spec.engine.args).problems)
    )
    if spec.engine.runtime == "container" and not spec.engine.executable.strip():
        # podman reads --entrypoint '' as "no entrypoint", quadlet drops an empty Entrypoint=: the targets
        # would run different programs.
        out.append(("engine.executable", "is empty; set the program the container runs (e.g. vllm)"))
    if spec.engine.runtime == "venv":
        out += _venv_problems(spec, image)
    else:
        out += _image_problems(spec, image)
    return out + _shutdown_problems(spec)


def make(
    spec: specmod.Deployment,
    lock: lockmod.Lock,
    *,
    spec_path: str,
    image: str | None = None,
    memlock: Literal["unlimited", "host"] | int | None = None,
    home: str | None = None,
    lock_entry: int | None = None,
) -> RunPlan:
    """Decide the run plan. Refuses every problem of :func:`problems` at once, then a missing image.
    ``lock_entry``: the history entry of the lock (``deploy.lock_entry``), labelled beside its sha256."""
    bad = problems(spec, image)
    if bad:
        raise SpecError(spec_path, bad)
    resolved = resolve_image(spec, lock, image)
    plan = build(spec, resolved, spec_path=spec_path, memlock=memlock, lock=lock, override=image, home=home)
    digest = lock_digest(spec, lock, resolved[0])
    entry = () if lock_entry is None else ((LOCK_ENTRY_LABEL, str(lock_entry)),)
    return dataclasses.replace(
        plan, lock_sha256=digest, labels=(*plan.labels, (LOCK_LABEL, digest[:16]), *entry)
    )


def _mounts(spec: specmod.Deployment, placed: list[secondary.Placement], home: str) -> list[PlanMount]:
    """The model dir, the spec's mounts, each secondary model's dir (read-only), then each absolute path a
    filled placeholder gives a flag (:mod:`.pathmounts`); ``~/`` is ``home``."""
    at = functools.partial(userhome.expand, home=home)
    mounts = [
        PlanMount(at(spec.model.local_dir), spec.model.container_path, True, "dir", None, "model"),
        *(
            PlanMount(at(spec.fill(m.host)), m.container, m.readonly, m.kind, m.sparse_size)
            for m in spec.mounts
        ),
        *(
            PlanMount(at(p.local_dir), p.container_path, True, "dir", None, "secondary", p.field)
            for p in placed
        ),
    ]
    filled = filled_paths(spec, [m.container for m in mounts])
    return [*mounts, *(PlanMount(f.path, f.path, f.readonly, f.kind) for f in filled)]


#: The last few specs' digests: validation and the plan each build one from the same spec object, and
#: dumping it as YAML is most of what building a plan costs. Kept with the spec, so its id is not reused.
_DIGESTS: dict[int, tuple[specmod.Deployment, str]] = {}


def spec_digest(spec: specmod.Deployment) -> str:
    """sha256 of the spec as YAML (the generated files' spec hash)."""
    seen = _DIGESTS.get(id(spec))
    if seen is not None and seen[0] is spec:
        return seen[1]
    digest = hashlib.sha256(specmod.dump(spec).encode()).hexdigest()
    if len(_DIGESTS) >= 8:
        _DIGESTS.pop(next(iter(_DIGESTS)))
    _DIGESTS[id(spec)] = (spec, digest)
    return digest


def lock_digest(spec: specmod.Deployment, lock: lockmod.Lock | None, image: str) -> str:
    """sha256 of the lock's facts this deployment runs from: the image it starts, its model's and secondary
    models' locked snapshots (another deployment's entries do not change it)."""
    pinned = {
        "image": image,
        "model": lock.models[spec.name].model_dump(mode="json")
        if lock and spec.name in lock.models
        else None,
        "secondary": {
            repo: m.model_dump(mode="json")
            for repo, m in sorted((lock.secondary if lock else {}).get(spec.name, {}).items())
        },
    }
    return hashlib.sha256(json.dumps(pinned, sort_keys=True).encode()).hexdigest()


def build(
    spec: specmod.Deployment,
    image: tuple[str, bool],
    *,
    spec_path: str,
    memlock: Literal["unlimited", "host"] | int | None = None,
    lock: lockmod.Lock | None = None,
    override: str | None = None,
    home: str | None = None,
) -> RunPlan:
    """The plan for a spec, unchecked (:func:`make` refuses the problems first; ``rendering.validate`` builds
    one to find the targets' problems too). ``lock``/``override`` (``--image``) tell which container paths the
    built image provides; ``home`` is what ``~/`` means (default: :mod:`rigsmith.userhome`'s)."""
    home = home or userhome.invoking_home()
    ref, pinned = image
    written = spec  # the spec as the user wrote it (the opt-ins rewrite a copy's argv)
    placed = secondary.placements(spec)
    spec, opted, listen = decisions.served(spec, placed, home)
    command = decisions.command(spec, written, lock, home)
    venv, model_arg = spec.engine.runtime == "venv", spec.engine.model_arg
    model_word = len(spec.engine.subcommand) + model_arg if venv and model_arg is not None else None
    mounts = _mounts(spec, placed, home)
    paths = _env_paths(spec, lock, override, mounts)
    gpus = spec.resources.gpus
    indices = tuple(d.split("=", 1)[1] for d in gpus.cdi_devices)
    grace = spec.resources.stop_grace_seconds
    shutdown = spec.shutdown_timeout
    digest = spec_digest(written)
    return RunPlan(
        name=spec.name,
        spec_path=spec_path,
        image=ref,
        image_pinned=pinned,
        entrypoint=spec.engine.executable,
        command=command,
        devices=gpus.cdi_devices,
        gpu_indices=indices,
        shm_size=spec.resources.shm_size,
        shm_bytes=spec.resources.shm_bytes,
        memlock=memlock if memlock is not None else spec.resources.memlock,
        stop_timeout=grace,
        shutdown_timeout=shutdown,
        env=tuple(
            (e.name, spec.fill(e.value))
            for e in spec.active_env()
            if not e.secret and e.name not in opted.not_passed
        ),
        secret_env=tuple(e.name for e in spec.active_env() if e.secret),
        secret_from=tuple(
            (e.name, e.host_source) for e in spec.active_env() if e.secret and e.host_source != e.name
        ),
        mounts=tuple(mounts),
        network_mode=spec.network.mode,
        host=listen,
        port=spec.network.port,
        health_path=spec.readiness.health_path,
        log_lines=spec.readiness.log_lines,
        kv_cache_tokens=spec.readiness.kv_cache_tokens,
        startup_seconds=spec.readiness.startup_seconds,
        spec_sha256=digest,
        labels=(("io.rigsmith.deployment", spec.name), ("io.rigsmith.spec-sha256", digest[:16])),
        runtime=spec.engine.runtime,
        venv=spec.engine.venv,
        model_word=model_word,
        secondary_words=tuple(len(spec.engine.subcommand) + sm.arg for sm in spec.secondary_models),
        env_paths=paths,
    )


def _env_paths(
    spec: specmod.Deployment, lock: lockmod.Lock | None, override: str | None, mounts: list[PlanMount]
) -> tuple[EnvPath, ...]:
    """The env values that name container paths, for a container runtime (a venv's are host paths)."""
    if spec.engine.runtime != "container":
        return ()
    builds = lock.builds if lock is not None else {}
    built = None if override or spec.engine.image else builds.get(spec.engine.build or "")
    provided = tuple(built.provides or ()) if built else ()
    return env_paths(spec, (m.container for m in mounts), provided, image_known=built is not None)
