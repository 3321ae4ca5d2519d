"""``invoke up --offline`` and ``invoke unbundle --prove-offline``: start with no route out, and name the
step that needed the network.

Why a network namespace, not ``--network none``: the podman target's run.sh starts the container with
``--network host``, and podman (runc) creates a host-network container in the namespace of its caller. So
run.sh run under ``nsenter --net=NS`` puts the engine in a namespace that holds only ``lo``: the very script
the user runs is what is proven, unchanged, and this process probes ``/health`` and watches for attempts out
from inside the same namespace (:mod:`.netwatch`). ``--network none`` would prove another argv than the one
deployed, and its health probe would need curl or Python inside every engine image (``podman exec``).

The steps, each named when it fails:

1. **local pieces**: everything ``up`` would fetch must be here already, verified against rigsmith.lock:
   the model files, the secondary models, the engine image (``podman run`` pulls a missing one). Each
   missing piece is named with the command that brings it online, and the bundle that carries it. Nothing
   is started.
2. **start**: run.sh inside the namespace.
3. **engine startup**: the recipe's gates (``wait``), ``/health`` probed from inside the namespace. Any
   connection attempt out (host:port) fails the proof, even when the engine got ready: an air-gapped rig
   would wait on, or fail at, that fetch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rigsmith.errors import PreflightError, RigsmithError
from rigsmith.operating.bundle import netwatch
from rigsmith.operating.doctor import drift
from rigsmith.operating.host import Host, LocalHost, image_facts
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.lifecycle import wait as waitmod
from rigsmith.project import Project
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.image import sources
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import expand_dir
from rigsmith.spec import Deployment

Memlock = Literal["unlimited", "host"] | int | None


#: Who a startup reaches out to, by host name (the name or any parent domain), and how to stop it.
REACHED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("huggingface.co", "hf.co"),
        "the Hugging Face Hub: set HF_HUB_OFFLINE=1 in the spec's env and give every model, tokenizer and "
        "adapter as a local path",
    ),
    (
        ("stats.vllm.ai",),
        "vLLM's usage statistics: set VLLM_NO_USAGE_STATS=1 (or DO_NOT_TRACK=1) in the spec's env",
    ),
    (
        ("pypi.org", "pythonhosted.org"),
        "a pip install at startup: pin the package in the image instead (images/NAME/image.yaml pip)",
    ),
    (
        ("github.com", "githubusercontent.com"),
        "a download at startup: put it in the image (the source tree or an asset in images/NAME/image.yaml)",
    ),
)


def why_reached(attempts: Sequence[str], name: str) -> str:
    """The hint for a startup that reached out: what each known host is, and what carries the rest."""
    hosts = {a.split(" ")[0].rsplit(":", 1)[0] for a in attempts}
    known = [
        what
        for domains, what in REACHED
        if any(h == d or h.endswith("." + d) for h in hosts for d in domains)
    ]
    carry = (
        f"`invoke bundle --deployment {name} --out DIR` carries the model, the secondary models and the image"
    )
    return "; ".join([*(f"it reached {w}" for w in known), carry])


class OfflineError(PreflightError):
    """The deployment could not start, or be shown to start, with no route out."""


@dataclass(frozen=True)
class Missing:
    """A piece ``up`` would fetch that is not here, and the command that brings it (online)."""

    what: str
    fix: str


def missing(
    project: Project,
    spec: Deployment,
    plan: planmod.RunPlan,
    host: Host,
    env: Mapping[str, str] | None = None,
) -> list[Missing]:
    """Step 1: every model file, secondary model and the image, as rigsmith.lock pins them, must be here;
    for a missing image built from a source tree, the tree and its assets in the build cache."""
    name = spec.name
    fetch = f"`invoke fetch-model --deployment {name}`"
    out: list[Missing] = []
    if spec.model.repo is None:
        if not expand_dir(spec.model.local_dir).is_dir():
            out.append(Missing(f"model dir {spec.model.local_dir}: missing (a local checkpoint)", "copy it"))
    else:
        facts = drift.model_facts(spec, lockmod.read(project.lock_path))
        pin = f"`invoke pin --deployment {name}`, then {fetch}"
        out += [Missing(f"model {repo}: rigsmith.lock pins no commit", pin) for repo in facts.unpinned]
        out += [Missing(f"model {facts.local_dir}: {p}", fetch) for p in facts.problems]
    if plan.runtime == "container":
        img = image_facts(host, plan.image, plan.image_pinned)
        if not img.present:
            out.append(
                Missing(
                    f"image {plan.image}: not in local storage (podman run would pull it)",
                    drift.image_fix(plan.image),
                )
            )
            out += _tree_missing(project, spec, env)
    return out


def _tree_missing(project: Project, spec: Deployment, env: Mapping[str, str] | None) -> list[Missing]:
    """A missing image built from a source tree: is the tree's locked commit, and each asset, in the cache
    ``invoke build`` reads (it fetches only what the cache lacks)?"""
    build = spec.engine.build
    locked = lockmod.read(project.lock_path).sources.get(f"images/{build}") if build else None
    if locked is None:
        return []
    cache = sources.Sources(sources.cache_root(env))
    fix = f"`invoke pin --deployment {spec.name}` (it caches the tree and assets), then `invoke build`"
    out = []
    if not cache.has_commit(locked.repo, locked.commit):
        out.append(
            Missing(
                f"source tree {locked.repo} @ {locked.commit[:12]} (images/{build}): not in the cache "
                f"{cache.mirror_path(locked.repo)}, and `invoke build` needs it",
                fix,
            )
        )
    for asset, a in locked.assets.items():
        if not cache.asset_path(a.sha256).is_file():
            out.append(Missing(f"source asset {asset} of images/{build} ({a.url}): not in the cache", fix))
    return out


@dataclass(frozen=True)
class OfflineReport:
    """A passed proof."""

    name: str
    namespace: netwatch.Netns
    health_url: str
    seconds: float
    kept_running: bool
    lookups: tuple[str, ...] = ()  # names looked up but never connected to

    def summary(self) -> str:
        text = (
            f"offline proof: {self.name} answered {self.health_url} from inside network namespace "
            f"{self.namespace.name} (only lo, no route out) after {self.seconds:.0f}s; no connection "
            "attempt out was seen"
        )
        if self.lookups:
            text += f" (looked up, never connected to: {', '.join(self.lookups)})"
        if self.kept_running:
            return (
                text + f"\n{self.name} keeps running there: reach it with "
                f"`{' '.join(self.namespace.enter_argv())} curl {self.health_url}`; "
                f"`invoke down --deployment {self.name}` stops it and removes the namespace"
            )
        return text + f"\nstopped again; `invoke up --deployment {self.name}` starts it for use"


def up_offline(
    ops: lifecycle.Ops,
    *,
    deployment: str | None = None,
    memlock: Memlock = None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    keep_running: bool = True,
    timeout: float | None = None,
) -> OfflineReport:
    """Start the deployment in a namespace with no route out and wait for its gates from inside it.

    Raises:
        OfflineError: a piece is missing (nothing started), or a step failed or reached out; the message
            names the step and every attempt out (host:port). A started container is stopped again.
    """
    spec = ops.project.load(deployment)
    name = spec.name
    plan = lifecycle.plan_for(ops.project, name)
    _refusals(ops, spec, plan)
    gone = missing(ops.project, spec, plan, ops.host, ops.env)
    if gone:
        raise OfflineError(
            f"up --offline {name}: step 'local pieces': {len(gone)} piece(s) `up` would fetch are not here; "
            "nothing was started:\n" + "\n".join(f"  - {m.what} (online: {m.fix})" for m in gone),
            hint=f"run those on a connected machine; or there `invoke bundle --deployment {name} --out DIR` "
            "(it carries the model, the secondary models and the image), then here `invoke unbundle DIR`",
        )
    ns = namespace(name)
    local = LocalHost(ops.env)
    ns.create(local)
    inner = dataclasses.replace(ops, start_prefix=tuple(ns.enter_argv()))
    step, err, seconds = "start", None, 0.0
    try:
        ops.echo(
            f"up --offline {name}: network namespace {ns.name} made (only lo: a connection out is refused, "
            "and named); run.sh runs inside it"
        )
        with netwatch.Watch(ns, netwatch.resolv_conf()) as watch:
            try:
                lifecycle.up(inner, deployment=name, memlock=memlock, yes=yes, confirm=confirm)
                step, t0 = "engine startup", time.monotonic()
                _wait(inner, spec, plan, ns, timeout)
                seconds = time.monotonic() - t0
            except RigsmithError as e:
                died = _engine_exited(inner, name, e.hint) if step == "start" else None
                step, err = ("engine startup", died) if died else (step, e)
    except BaseException:  # the watch could not start, or Ctrl-C: nothing half-started stays behind
        _stop(ops, name, ns, local)
        raise
    if err is not None or watch.attempts:  # a lookup alone is no attempt: it sends nothing out
        _stop(ops, name, ns, local)
        raise _failure(name, ns, step, err, watch.named())
    if not keep_running:
        _stop(ops, name, ns, local)
    return OfflineReport(name, ns, plan.health_url, seconds, keep_running, tuple(watch.lookups_only()))


def namespace(name: str) -> netwatch.Netns:
    """The namespace ``up --offline`` runs deployment ``name`` in: ``rigsmith-NAME``, a file name under
    /run/netns that ``ip netns`` takes as is (the spec holds NAME to 63 of [a-z0-9._-], alnum first)."""
    return netwatch.Netns(f"rigsmith-{name}")


def release(ops: lifecycle.Ops, deployment: str | None) -> None:
    """After ``down``: drop the namespace an ``up --offline`` left the deployment running in, if any."""
    name = ops.project.resolve_name(deployment)
    ns = namespace(name)
    if ns.path.exists():
        ns.delete(LocalHost(ops.env))
        ops.echo(f"down {name}: network namespace {ns.name} (from up --offline) removed")


def _refusals(ops: lifecycle.Ops, spec: Deployment, plan: planmod.RunPlan) -> None:
    why = None
    if ops.target != "podman":
        why = (
            f"--target {ops.target}: the service manager starts the unit outside any namespace rigsmith "
            "makes; the offline proof runs the podman target's run.sh"
        )
    elif spec.cluster is not None:
        why = "a multi-node deployment: its nodes talk to each other, a namespace with no route out cannot"
    elif plan.network_mode != "host":
        why = "network.mode none: the API answers nowhere outside the container, so nothing can probe it"
    if why:
        raise OfflineError(
            f"up --offline {spec.name}: {why}",
            hint=f"`invoke up --deployment {spec.name} --offline --target podman` on a one-host deployment "
            "with network.mode host",
        )
    info = lifecycle.inspect(ops.run, spec.name)
    if info and (info.get("State") or {}).get("Running"):
        raise OfflineError(
            f"up --offline {spec.name}: it is already running (with this host's network); the proof starts "
            "it itself, inside a namespace with no route out",
            hint=f"`invoke down --deployment {spec.name}` first",
        )


def _wait(
    ops: lifecycle.Ops, spec: Deployment, plan: planmod.RunPlan, ns: netwatch.Netns, timeout: float | None
) -> None:
    logs = waitmod.LogFollower(argv=lifecycle.logs_argv(ops, deployment=spec.name, follow=True), env=ops.env)
    probe = waitmod.http_health(plan.health_url)
    with netwatch.inside(ns) as call:
        waitmod.wait(
            waitmod.Gates.from_spec(spec),
            logs,
            lambda: call(probe),
            timeout=waitmod.timeout_for(spec) if timeout is None else timeout,
            echo=ops.echo,
        )


def _engine_exited(ops: lifecycle.Ops, name: str, hint: str | None) -> RigsmithError | None:
    """When ``up`` failed after run.sh made the container because the engine had already exited (up's
    re-check found it stopped): the engine's startup failing, told with its last log lines; else None."""
    info = lifecycle.inspect(ops.run, name)
    if info is None or (info.get("State") or {}).get("Running"):
        return None
    tail = ops.run(lifecycle.logs_argv(ops, deployment=name, tail=10))
    lines = (tail.stdout + tail.stderr).splitlines()
    return RigsmithError(
        "the engine exited right after the start\n  last log lines:\n"
        + "\n".join(f"  | {ln}" for ln in lines),
        hint=hint,
    )


def _stop(ops: lifecycle.Ops, name: str, ns: netwatch.Netns, local: LocalHost) -> None:
    """Stop what the proof started, and drop the namespace (a failed stop is said, not raised: the proof's
    own verdict is the error that matters)."""
    try:
        if lifecycle.inspect(ops.run, name) is not None:
            lifecycle.down(ops, deployment=name)
    except RigsmithError as err:
        ops.echo(f"warning: stopping {name} after the offline proof: {err.message}")
    finally:  # whatever the stop raised (Ctrl-C, an OSError), the namespace does not outlive the proof
        ns.delete(local)


def _failure(
    name: str, ns: netwatch.Netns, step: str, err: RigsmithError | None, attempts: Sequence[str]
) -> OfflineError:
    where = f"offline proof of {name}: step '{step}'"
    tried = (
        f"tried to reach {', '.join(attempts)} (refused: namespace {ns.name} has no route out)"
        if attempts
        else "no connection attempt out was seen"
    )
    hint = why_reached(attempts, name)
    if err is None:
        return OfflineError(
            f"{where} reached out: the engine answered /health, but during startup it {tried}; an air-gapped "
            "rig would wait on or fail at that fetch; stopped again",
            hint=hint,
        )
    head = f"{where} needed the network: it {tried}" if attempts else f"{where} failed; {tried}"
    return OfflineError(f"{head}; stopped again\n{err.message}", hint=hint if attempts else err.hint)
