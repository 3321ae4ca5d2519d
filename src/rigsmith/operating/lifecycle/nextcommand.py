"""``invoke next``: where a deployment stands (imported → pinned → fetched → built → deployed → up →
qualified) and the command for the next step.

Every stage is computed from what is here: the spec, rigsmith.lock, the model dir, the rendered files and
podman's local storage and containers. Nothing touches the network. Stages are checked in order and the walk
stops at the first that is not done: a later stage is "not checked yet", never assumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rigsmith import writer
from rigsmith.errors import RigsmithError
from rigsmith.operating.bench import bench
from rigsmith.operating.doctor import drift
from rigsmith.operating.host import Host, image_facts
from rigsmith.operating.lifecycle.verify import SPEC_LABEL, inspect_argv, parse_inspect
from rigsmith.project import Project
from rigsmith.rendering import deploy as deploymod
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.image import engineroute
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.spec import Deployment

STAGES = ("imported", "pinned", "fetched", "built", "deployed", "up", "qualified")
#: Targets whose container ``invoke up`` starts and ``next`` can inspect from here.
UP_TARGETS = ("podman", "quadlet")


@dataclass(frozen=True)
class Stage:
    """One stage: done or not, what was seen, and the command that moves it on."""

    name: str
    done: bool
    detail: str
    command: str | None = None


@dataclass
class _Ctx:
    project: Project
    spec: Deployment
    lock: lockmod.Lock
    target: str
    host: Host

    @property
    def d(self) -> str:
        return f"--deployment {self.spec.name}"


def stages(project: Project, deployment: str | None, target: str, host: Host) -> list[Stage]:
    """Every stage up to and including the first one not done."""
    name = project.resolve_name(deployment)
    spec = project.load(name)
    ctx = _Ctx(project, spec, lockmod.read(project.lock_path), target, host)
    out = [_imported(ctx, f"deployments/{name}.yaml")]
    if not out[0].done:
        return out
    checks: tuple[Callable[[_Ctx], Stage], ...] = (_pinned, _fetched, _built, _deployed, _up, _qualified)
    for check in checks:
        stage = check(ctx)
        out.append(stage)
        if not stage.done:
            break
    return out


def report(found: list[Stage]) -> list[str]:
    """The lines ``invoke next`` prints: one per stage, then the next command."""
    lines = []
    for s in found:
        lines.append(f"  {'done' if s.done else 'NEXT':<4}  {s.name:<9}  {s.detail}")
    done = len(found) if found[-1].done else len(found) - 1
    for name in STAGES[len(found) :]:
        lines.append(f"  {'':<4}  {name:<9}  not checked yet")
    last = found[-1]
    if last.done:
        lines.append(f"where: {last.name} — every stage is done")
    else:
        lines.append(f"where: {found[done - 1].name if done else 'nothing yet'}; next: {last.command}")
    return lines


def _imported(c: _Ctx, path: str) -> Stage:
    """Imported, and every placeholder the import left (the model first) filled."""
    unfilled = c.spec.fill_problems()
    if not unfilled:
        return Stage("imported", True, path)
    field, what = unfilled[0]
    more = f" (and {len(unfilled) - 1} more placeholder(s))" if len(unfilled) > 1 else ""
    return Stage("imported", False, f"{path}: {field} {what}{more}", f"fill {field} in {path}")


def _pinned(c: _Ctx) -> Stage:
    spec, lock = c.spec, c.lock
    missing = []
    if spec.model.repo is not None and spec.name not in lock.models:
        missing.append(f"model {spec.model.repo}")
    image = spec.engine.image
    floating = bool(image) and "@sha256:" not in str(image) and image not in lock.images
    # a local-only name (localhost/…) has no registry digest to pin
    if spec.engine.runtime == "container" and floating and not str(image).startswith("localhost/"):
        missing.append(f"image {image}")
    if missing:
        return Stage(
            "pinned", False, "rigsmith.lock has no pin for " + ", ".join(missing), f"invoke pin {c.d}"
        )
    model = lock.models.get(spec.name)
    what = f"model at {model.commit[:12]}" if model else "local checkpoint (nothing to pin)"
    return Stage("pinned", True, what)


def _fetched(c: _Ctx) -> Stage:
    m = drift.model_facts(c.spec, c.lock)
    fetch = f"invoke fetch-model {c.d}"
    if c.spec.model.repo is None:
        present = c.host.tree_bytes(c.spec.model.local_dir)
        if not present:
            where = c.spec.model.local_dir
            return Stage("fetched", False, f"no checkpoint at {where}", f"copy the checkpoint to {where}")
        return Stage("fetched", True, f"local checkpoint at {c.spec.model.local_dir}")
    if m.problems:
        return Stage(
            "fetched", False, f"{len(m.problems)} file problem(s): " + "; ".join(m.problems[:3]), fetch
        )
    if m.unpinned:
        return Stage("fetched", False, "not pinned: " + ", ".join(m.unpinned), f"invoke pin {c.d}")
    return Stage("fetched", True, f"{m.checked} files at {m.local_dir} match rigsmith.lock (sizes)")


def _built(c: _Ctx) -> Stage:
    spec = c.spec
    if spec.engine.runtime == "venv":
        return Stage("built", True, f"runs from the venv {spec.engine.venv} (no image)")
    try:
        ref, pinned = planmod.resolve_image(spec, c.lock, None)
    except RigsmithError as err:
        how = (
            f"invoke build {c.d}"
            if spec.engine.build
            else f"set engine.image in deployments/{spec.name}.yaml"
        )
        return Stage("built", False, err.message, how)
    img = image_facts(c.host, ref, pinned)
    if not img.present:
        how = (
            f"invoke build {c.d}"
            if spec.engine.build
            else engineroute.missing_image(spec, ref, engineroute.proposed(c.project, spec))
        )
        return Stage("built", False, f"{ref} is not in local storage", how)
    return Stage("built", True, f"{ref} in local storage")


def _deployed(c: _Ctx) -> Stage:
    cmd = f"invoke deploy --target {c.target} {c.d}"
    try:
        _plan, files = deploymod.artifacts(c.project, c.target, deployment=c.spec.name)
    except RigsmithError as err:
        return Stage("deployed", False, f"cannot render: {err.message}", cmd)
    states = [o.status for o in writer.plan(files)]
    if "create" in states:
        return Stage("deployed", False, f"the {c.target} files are not written yet", cmd)
    if any(s != "identical" for s in states):
        detail = (
            f"the {c.target} files differ from what the spec renders now (or were rendered with other flags; "
            f"`invoke deploy --check --target {c.target} {c.d}` shows how)"
        )
        return Stage("deployed", False, detail, cmd)
    return Stage("deployed", True, f"{len(files)} {c.target} file(s) as the spec renders them")


def _up(c: _Ctx) -> Stage:
    name = c.spec.name
    if c.target not in UP_TARGETS:
        detail = f"not checked from here for --target {c.target}: start it as deploy printed"
        return Stage("up", False, detail, f"invoke check-container {c.d} (once it runs)")
    res = c.host.run(inspect_argv(name))
    info = parse_inspect(res.stdout) if res.code == 0 else None
    start = f"invoke up --target {c.target} {c.d}"
    if not info or not (info.get("State") or {}).get("Running"):
        return Stage("up", False, f"{name} is not running", start)
    try:
        plan = planmod.make(c.spec, c.lock, spec_path=f"deployments/{name}.yaml")
    except RigsmithError as err:
        return Stage("up", False, f"cannot render: {err.message}", start)
    label = ((info.get("Config") or {}).get("Labels") or {}).get(SPEC_LABEL)
    if label != dict(plan.labels).get(SPEC_LABEL):
        return Stage("up", False, f"{name} runs from an older spec", f"invoke down {c.d}, then {start}")
    return Stage("up", True, f"{name} is running the current spec")


def _qualified(c: _Ctx) -> Stage:
    text = c.project.lock_path.read_text(encoding="utf-8") if c.project.lock_path.exists() else ""
    key = bench.lock_key(text, c.spec)
    rows = [
        r for r in bench.history(bench.results_path(c.project.root), c.spec.name) if r.get("lock_key") == key
    ]
    if not rows:
        return Stage(
            "qualified", False, "no bench run for this lock and spec yet",
            f"invoke wait {c.d}, then invoke bench --compare {c.d}",
        )  # fmt: skip
    return Stage("qualified", True, f"bench run {rows[-1].get('time', '?')} for this lock (key {key})")


def after_import(spec: Deployment, project: Project, configured: str | None) -> list[str]:
    """What ``import-recipe`` prints last: which deployment bare commands act on now (``project``'s default,
    the newest import unless RIGSMITH_DEPLOYMENT names another; ``configured``: invoke.yaml's), then the
    commands from here to a qualified deployment, in order."""
    d = f"--deployment {spec.name}"
    try:
        bare = project.resolve_name(None)
    except RigsmithError:
        bare = None
    if bare == spec.name:
        over = f" (instead of invoke.yaml's {configured})" if configured and configured != spec.name else ""
        acting = f"bare commands (`invoke next`, `invoke up`, …) now act on {spec.name}, the newest import"
        acting += over
    elif bare is not None:
        acting = f"bare commands act on {bare} ({project.default_source}); pass {d} for this one"
    else:
        acting = f"several deployments and no default: pass {d} (as below)"
    steps = [f"invoke pin {d}", f"invoke fetch-model {d}" if spec.model.repo else None]
    steps += [f"invoke build {d}" if spec.engine.build else None, f"invoke doctor {d}"]
    steps += [f"invoke deploy --target podman {d}", f"invoke up {d}", f"invoke wait {d}"]
    steps += [f"invoke bench --compare {d}"]
    # The model first: nothing can be pinned without it (other placeholders are named in the notes above).
    path = f"deployments/{spec.name}.yaml"
    fill = [f"fill {f} in {path}: {w}" for f, w in spec.fill_problems() if f == "model.repo"]
    steps = [*fill, *steps]
    lines = [acting, "next, in order (after filling in what is named above, if anything):"]
    lines += [f"  {i}. {s}" for i, s in enumerate((s for s in steps if s), 1)]
    lines.append(f"`invoke next {d}` says where it stands at any time")
    return lines
