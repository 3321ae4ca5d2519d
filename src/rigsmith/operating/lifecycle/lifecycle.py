"""``invoke up`` / ``down`` / ``status`` / ``logs`` for the podman and quadlet targets.

Converge, act, re-check:

- ``up``: render the target's artifacts and compare them with the disk (writer: create silently, ask before
  changing anything that exists); inspect the container; start it only if it is not already running from
  this very spec; then inspect again and fail loudly unless every CDI device node and env var of the plan
  really arrived (compose front-ends have been seen dropping devices silently: seeds/000 pitfall 1).
- ``down``: note the container's host PIDs, stop it (the target's stop waits the plan's grace), confirm it
  is gone, then list any process of this deployment still holding a GPU, with the command that reaps it
  (vLLM workers can outlive their API server: anchors pain point 5).

Commands are argv lists built per target (``Controller``); quadlet's systemctl/journalctl argv are unit-
tested, and run for real only where systemd runs. podman is found on PATH (tests put an isolated-storage
wrapper first, exactly as for the generated scripts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rigsmith import writer
from rigsmith.errors import CommandError, LockDriftError, PreflightError, RigsmithError
from rigsmith.operating import probes
from rigsmith.operating.cluster import lifecycle as clusterlife
from rigsmith.operating.cluster.lifecycle import NodeControl
from rigsmith.operating.doctor import drift
from rigsmith.operating.host import Host, LocalHost, image_facts, probe, quadlet_lacks, quadlet_podman
from rigsmith.operating.lifecycle import rootcause, undo
from rigsmith.operating.lifecycle.gpuholders import (
    Holder,
    classify_holders,
    parse_top,
    reap_command,
    survivors,
    top_argv,
)
from rigsmith.operating.lifecycle.verify import (
    SPEC_LABEL,
    cdi_edits,
    container_problems,
    inspect_argv,
    parse_inspect,
)
from rigsmith.operating.probes import CmdResult
from rigsmith.project import Project
from rigsmith.rendering import deploy as deploymod
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.cluster import node_plans
from rigsmith.resolving.lock import lock as lockmod

OPS_TARGETS = ("podman", "quadlet")
#: Where systemd's quadlet generator reads rootful units (podman-systemd.unit(5)).
QUADLET_DIR = Path("/etc/containers/systemd")

#: Runs argv to the end, capturing its output (``LocalHost.run``, the one command runner).
Run = Callable[[Sequence[str]], CmdResult]
#: Seconds one lifecycle command may take (a `podman run` pulls the image).
COMMAND_TIMEOUT = 600


def _must(run: Run, argv: Sequence[str], hint: str | None = None) -> CmdResult:
    proc = run(argv)
    if proc.code != 0:
        raise CommandError(argv, proc.code, proc.stderr or proc.stdout, hint=hint)
    return proc


# -- per-target commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Controller:
    """The argv that start, stop and show one deployment under one target."""

    target: Literal["podman", "quadlet"]
    name: str
    artifacts: Path  # the target's output directory for this deployment (podman/NAME, quadlet/)

    @property
    def unit(self) -> str:
        return f"{self.name}.service"

    def start(self) -> list[list[str]]:
        if self.target == "quadlet":
            # quadlet turns NAME.container into NAME.service at daemon-reload.
            return [["systemctl", "daemon-reload"], ["systemctl", "start", self.unit]]
        return [["bash", str(self.artifacts / "run.sh")]]

    def stop(self, grace: int) -> list[list[str]]:
        if self.target == "quadlet":
            return [["systemctl", "stop", self.unit]]
        script = self.artifacts / "stop.sh"
        if script.is_file():
            return [["bash", str(script)]]
        return [["podman", "stop", "--time", str(grace), self.name], ["podman", "rm", "--force", self.name]]

    def state(self) -> list[str] | None:
        """Service-manager state probe (quadlet only; podman's state comes from inspect)."""
        if self.target == "quadlet":
            return ["systemctl", "show", self.unit, "--property=ActiveState,SubState,MainPID"]
        return None

    def logs(self, follow: bool = False, tail: int | None = None) -> list[str]:
        if self.target == "quadlet":
            argv = ["journalctl", "--unit", self.unit, "--no-pager", "--output", "cat"]
            argv += ["--lines", str(tail)] if tail is not None else []
            return argv + (["--follow"] if follow else [])
        argv = ["podman", "logs"]
        argv += ["--tail", str(tail)] if tail is not None else []
        return argv + (["--follow"] if follow else []) + [self.name]


def controller(project: Project, target: str, name: str, out: Path | None = None) -> Controller:
    """The controller for a target, or a clear error for targets ops cannot drive."""
    if target not in OPS_TARGETS:
        raise RigsmithError(
            f"up/down/status/logs drive the podman and quadlet targets, not {target!r}",
            hint="use --target podman or --target quadlet",
        )
    base = (out or project.root).resolve()
    d = base / "podman" / name if target == "podman" else base / "quadlet"
    return Controller(target, name, d)  # type: ignore[arg-type]


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``systemctl show --property=…`` → key → value."""
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


# -- inspect ------------------------------------------------------------------------------------------


def inspect(run: Run, name: str) -> dict[str, Any] | None:
    proc = run(inspect_argv(name))
    return parse_inspect(proc.stdout) if proc.code == 0 else None


# -- up -----------------------------------------------------------------------------------------------


@dataclass
class Ops:
    """Where ops act: the project, a target, the subprocess env and the host probes."""

    project: Project
    target: str = "podman"
    out: Path | None = None
    env: Mapping[str, str] | None = None
    echo: Callable[[str], None] = print
    host: Host = field(default_factory=LocalHost)
    quadlet_dir: Path = QUADLET_DIR
    #: multi-node: how to reach nodes (name → Host) instead of their spec's ssh / this machine, and how to
    #: drive them instead of the target's artifacts (tests run nodes in network namespaces)
    nodes: Mapping[str, Host] | None = None
    node_control: NodeControl | None = None
    start_prefix: tuple[str, ...] = ()  # runs the start command inside another namespace (offline.py)

    def __post_init__(self) -> None:
        if self.target not in OPS_TARGETS:
            raise RigsmithError(
                f"up/down/status/logs drive the podman and quadlet targets, not {self.target!r}",
                hint="use --target podman or --target quadlet",
            )
        if isinstance(self.host, LocalHost) and self.host.env is None and self.env is not None:
            self.host = LocalHost(self.env)

    @property
    def run(self) -> Run:
        return LocalHost(self.env, timeout=COMMAND_TIMEOUT).run


def rendered(
    ops: Ops, deployment: str | None, image: str | None, memlock: Literal["unlimited", "host"] | int | None
) -> tuple[planmod.RunPlan, list[writer.Artifact]]:
    """The plan and the target's files: quadlet units for the podman of this host, where they run."""
    name = ops.project.resolve_name(deployment)
    kw: deploymod.RenderOptions = {"deployment": name, "image": image, "out": ops.out, "memlock": memlock}
    spec = ops.project.load(name)
    if ops.target == "quadlet" and spec.cluster is None:  # a cluster's units run on its nodes' podman
        kw["podman_version"] = quadlet_podman(ops.host, spec.podman_version)[0]
    return deploymod.artifacts(ops.project, ops.target, **kw)


def quadlet_installs(files: Sequence[writer.Artifact], name: str, unit_dir: Path) -> list[writer.Artifact]:
    """The rendered quadlet units again, at the place systemd's generator reads them (same content, so
    the writer reports identical/create/update there too and asks before changing an installed unit)."""
    return [
        writer.Artifact(unit_dir / a.path.name, a.content, 0o644)
        for a in files
        if a.path.name.startswith(f"{name}.")
    ]


def _rel(path: Path, root: Path) -> Path:
    return path.relative_to(root) if path.is_relative_to(root) else path


def up(
    ops: Ops,
    *,
    deployment: str | None = None,
    image: str | None = None,
    memlock: Literal["unlimited", "host"] | int | None = None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    dry_run: bool = False,
    ignore_drift: bool = False,
) -> planmod.RunPlan:
    """Converge the deployment to running-as-planned; returns the plan it verified against.

    Refuses (LockDriftError) when the model dir or the pinned image differ from rigsmith.lock, unless
    ``ignore_drift``: then it names the differences and starts anyway.
    """
    plan, files = rendered(ops, deployment, image, memlock)
    if ops.project.load(plan.name).cluster is not None:
        return ops_up(ops, plan, files, yes=yes, confirm=confirm, dry_run=dry_run, ignore_drift=ignore_drift)
    if ops.target == "quadlet":
        ops.echo(quadlet_podman(ops.host, ops.project.load(plan.name).podman_version)[1])
    _drift_gate(ops, plan, ignore_drift)
    installs: list[writer.Artifact] = []
    if ops.target == "quadlet":
        installs = quadlet_installs(files, plan.name, ops.quadlet_dir)
        files = [*files, *installs]
    ctl = controller(ops.project, ops.target, plan.name, ops.out)
    root = (ops.out or ops.project.root).resolve()
    changed = [o for o in writer.plan(files) if o.status != "identical"]
    info = inspect(ops.run, plan.name)
    running = bool(info and (info.get("State") or {}).get("Running"))
    same = bool(
        info
        and ((info.get("Config") or {}).get("Labels") or {}).get(SPEC_LABEL) == dict(plan.labels)[SPEC_LABEL]
    )
    steps = [f"{o.status} {_rel(o.artifact.path, root)}" for o in changed]
    if running and not same:
        raise RigsmithError(
            f"{plan.name} is running from a different spec than deployments/{plan.name}.yaml renders now",
            hint=f"`invoke down --deployment {plan.name}` first, then `invoke up` again",
        )
    if info and not running:
        steps.append(f"remove the stopped container {plan.name}")
    if not running:
        steps += [f"run {' '.join(a)}" for a in ctl.start()]
    ops.echo(
        f"up {plan.name} ({ops.target}): " + ("; ".join(steps) if steps else "already running, up to date")
    )
    if dry_run:
        return plan
    if not running:
        preflight(ops, plan)  # before any write: a host that cannot start it gets nothing installed
    before = {a.path: undo.previous(a.path) for a in installs}
    if changed:
        writer.write(files, yes=yes, confirm=confirm, echo=ops.echo, root=root)
    try:
        if info and not running:
            _must(ops.run, ["podman", "rm", "--force", plan.name])
        if not running:
            try:
                for argv in [[*ops.start_prefix, *a] for a in ctl.start()]:
                    _must(ops.run, argv, hint="fix what the script names, then `invoke up` again")
            except CommandError as err:  # root cause first: doctor's failing row, then the script's words
                skip = ("memlock",) if memlock is not None else ()
                blocker = rootcause.first_blocker(ops.project, plan.name, ops.target, ops.host, skip=skip)
                if ops.target == "quadlet":  # systemctl says only "see journalctl": the engine's own words
                    logs = ctl.logs(tail=20)
                    raise rootcause.service_failed(err, ops.run(logs), logs, blocker, plan.name) from None
                raise rootcause.lead(err, blocker, plan.name, ops.target) from None
    except RigsmithError:
        undo.installs(before, ops.echo)
        if not running:
            undo.start(ops.run, ctl.target, ctl.name, bool(before), ops.echo)
        raise
    verify(ops, plan)
    return plan


def preflight(ops: Ops, plan: planmod.RunPlan) -> None:
    """What ``up`` checks before it writes anything on the host (PreflightError naming every reason). quadlet:
    systemd as PID 1 (daemon-reload makes the unit a service) and podman's quadlet generator, else the unit
    installed in /etc/containers/systemd is read by nothing (issue 24; doctor's podman check agrees)."""
    problems = quadlet_lacks(ops.host, f"{plan.name}.container") if ops.target == "quadlet" else []
    if problems:
        raise PreflightError(
            f"up --target {ops.target}: refused before writing anything: " + "; ".join(problems),
            hint="use --target podman (plain podman run), or a host whose podman has quadlet and whose init "
            "is systemd; `invoke doctor --target quadlet` checks it",
        )


def _drift_gate(ops: Ops, plan: planmod.RunPlan, ignore: bool) -> None:
    spec = ops.project.load(plan.name)
    model = drift.model_facts(spec, lockmod.read(ops.project.lock_path))
    image = image_facts(ops.host, plan.image, plan.image_pinned) if plan.runtime == "container" else None
    try:
        drift.gate(plan.name, model, image)
    except LockDriftError as err:
        if not ignore:
            raise
        ops.echo(f"warning (--ignore-drift): {err.message}")


def verify(ops: Ops, plan: planmod.RunPlan) -> None:
    """Re-check the running container against the plan; PreflightError naming every difference."""
    info = inspect(ops.run, plan.name)
    if info is None:
        raise PreflightError(
            f"container {plan.name} does not exist after start",
            hint=f"`invoke logs --deployment {plan.name}`; `podman ps -a`",
        )
    problems = container_problems(info, plan, cdi_edits(ops.host))
    if problems:
        raise PreflightError(
            f"container {plan.name} is not what deployment {plan.name} asks for:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint=f"`invoke down --deployment {plan.name}`, fix the cause named above, `invoke up` again",
        )
    ops.echo(
        f"verified {plan.name}: running; {len(plan.devices)} CDI device(s) and {len(plan.env)} env "
        f"var(s) arrived; shm {plan.shm_size}; stop timeout {plan.stop_timeout}s"
    )


# -- down ---------------------------------------------------------------------------------------------


def down(ops: Ops, *, deployment: str | None = None) -> list[Holder]:
    """Stop the deployment, confirm it is gone, and fail listing orphans still holding a GPU."""
    spec = ops.project.load(deployment)
    name = spec.name
    if spec.cluster is not None:
        plan, _files = rendered(ops, deployment, None, None)
        clusterlife.down(from_ops(ops, plan), plan.stop_timeout)
        return []
    ctl = controller(ops.project, ops.target, name, ops.out)
    info = inspect(ops.run, name)
    snapshot: dict[int, str] = {}
    if info:
        top = ops.run(top_argv(name))
        snapshot = parse_top(top.stdout) if top.code == 0 else {}
        grace = int((info.get("Config") or {}).get("StopTimeout") or spec.resources.stop_grace_seconds)
        ops.echo(f"down {name} ({ops.target}): stopping (up to {grace}s grace for vLLM to drain)")
        for argv in ctl.stop(grace):
            _must(ops.run, argv)
        if inspect(ops.run, name) is not None:
            raise RigsmithError(f"container {name} still exists after stop", hint=f"podman rm --force {name}")
        ops.echo(f"down {name}: container stopped and removed")
    else:
        ops.echo(f"down {name}: no container named {name}; checking the GPUs anyway")
        info = _stop_service_without_container(ops, ctl)
    left = survivors(snapshot, {pid: _cmdline(ops.host, pid) for pid in snapshot})
    holders: list[Holder] = []
    res = probe(ops.host, probes.COMMANDS["apps"])
    gpus_checked = False
    try:
        probes.check_nvsmi(res.code, res.stdout, res.stderr)
        apps = probes.parse_apps(res.stdout)
        holders = classify_holders(
            apps, set(snapshot), {a.pid: _cmdline(ops.host, a.pid) or "" for a in apps}
        )
        gpus_checked = True
    except probes.NoDriver as err:
        ops.echo(f"down {name}: cannot check the GPUs for leftover processes ({err})")
    held = {h.pid for h in holders}
    orphans = [h for h in holders if h.why != "foreign"]
    orphans += [
        Holder(pid, args, "-", None, "survived the container stop") for pid, args in left if pid not in held
    ]
    for h in holders:
        ops.echo(f"  GPU holder PID {h.pid} {h.name} on {h.gpu} {h.used_mib} MiB: {h.why}")
    if orphans:
        raise RigsmithError(
            f"{len(orphans)} process(es) of {name} outlived the stop or still hold GPU memory: "
            + ", ".join(f"PID {h.pid} ({h.name}, {h.why})" for h in orphans),
            hint=f"reap them: {reap_command(orphans)}",
        )
    ops.echo(f"down {name}: {rootcause.down_summary(gpus_checked, bool(info))}")
    return holders


#: systemd states of a service that is doing something (a restart loop between two runs included).
_BUSY = ("active", "activating", "deactivating", "reloading", "failed")


def _stop_service_without_container(ops: Ops, ctl: Controller) -> dict[str, Any] | None:
    """quadlet: a service that is up, restarting between runs or failed while its container is gone is
    still this deployment's: stopped and its failed state reset. Returns what ``down`` reports as
    "there was something" (the service's state), None when there was nothing."""
    argv = ctl.state()
    if argv is None:
        return None
    res = ops.run(argv)
    svc = parse_systemctl_show(res.stdout) if res.code == 0 else {}
    if svc.get("ActiveState") not in _BUSY:
        return None
    for a in ctl.stop(0):
        _must(ops.run, a)
    ops.run(["systemctl", "reset-failed", ctl.unit])  # nothing to reset unless it failed: not an error
    state = f"{svc['ActiveState']}/{svc.get('SubState', '?')}"
    ops.echo(f"down {ctl.name}: stopped {ctl.unit} (it was {state} with no container)")
    return {"State": svc}


def _cmdline(host: Host, pid: int) -> str | None:
    text = host.read(f"/proc/{pid}/cmdline")
    return None if text is None else text.replace("\0", " ").strip()


# -- logs ----------------------------------------------------------------------------------------------


def logs_argv(
    ops: Ops, *, deployment: str | None = None, follow: bool = False, tail: int | None = None
) -> list[str]:
    """The command that shows the deployment's logs."""
    name = ops.project.resolve_name(deployment)
    return controller(ops.project, ops.target, name, ops.out).logs(follow, tail)


def plan_for(project: Project, deployment: str | None, **kw: Any) -> planmod.RunPlan:
    """The RunPlan of a deployment (spec + lock)."""
    name = project.resolve_name(deployment)
    return planmod.make(
        project.load(name), lockmod.read(project.lock_path), spec_path=f"deployments/{name}.yaml", **kw
    )


# -- multi-node: the cluster (clusterlife) driven from Ops -------------------------------------------


def from_ops(ops: Ops, plan: planmod.RunPlan) -> clusterlife.Cluster:
    """The multi-node deployment of ``plan`` with a Host and the target's control for each node."""
    spec = ops.project.load(plan.name)
    local = LocalHost(ops.env, timeout=COMMAND_TIMEOUT)
    root = (ops.out or ops.project.root).resolve()
    return clusterlife.build(
        spec, node_plans(spec, plan), target=ops.target, root=root, local=local, hosts=ops.nodes,
        control=ops.node_control, echo=ops.echo,
    )  # fmt: skip


def ops_up(
    ops: Ops,
    plan: planmod.RunPlan,
    files: list[writer.Artifact],
    *,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    dry_run: bool,
    ignore_drift: bool,
) -> planmod.RunPlan:
    """up for a multi-node deployment: artifacts written here, then the nodes in order (clusterlife)."""
    c = from_ops(ops, plan)
    root = (ops.out or ops.project.root).resolve()
    changed = [o for o in writer.plan(files) if o.status != "identical"]
    steps = [f"{o.status} {_rel(o.artifact.path, root)}" for o in changed]
    steps += [f"start {n.plan.name} on {n.node.name} unless running" for n in c.nodes]
    ops.echo(f"up {plan.name} ({ops.target}, {len(c.nodes)} nodes): " + "; ".join(steps))
    if dry_run:
        return plan
    clusterlife.preflight(c)  # before any write: a node unreachable or running another spec or lock
    if changed:
        writer.write(files, yes=yes, confirm=confirm, echo=ops.echo, root=root)
    clusterlife.drift_gate(c, lockmod.read(ops.project.lock_path), ignore_drift)
    clusterlife.up(c)
    return plan


def cluster_of(ops: Ops, deployment: str | None = None) -> clusterlife.Cluster | None:
    """A multi-node deployment's nodes and the means to act on them (status, logs, wait); None: one host."""
    if ops.project.load(deployment).cluster is None:
        return None
    return from_ops(ops, rendered(ops, deployment, None, None)[0])
