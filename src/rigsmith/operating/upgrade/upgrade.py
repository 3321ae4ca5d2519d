"""``invoke upgrade``: repin → fetch → build → deploy → stop the old → up → wait → bench, with the
last-known-good kept until the new one passes, and an automatic rollback when it does not.

Before anything changes: the current lock is a recorded entry (the last-known-good, N), the repin runs
into a staged copy (``repin``), and each model dir must have room for the new snapshot's changed files
while the old ones stay (``lastgood.bytes_needed``). Then the old model files are hard-linked into their
kept snapshot and the old image tagged, the new lock is written (entry M), fetched, built, rendered and
started. A step that fails, readiness gates that never pass, or a bench that regresses beyond the
threshold against the last-known-good's bench (decode tok/s down, TTFT up; the best of up to
``BENCH_TRIES`` runs, so a moment of load elsewhere is not a regression) puts lock N back through
``rollback`` (model files, artifacts, image), waits for it to be ready again, and fails saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigsmith.errors import PreflightError, RigsmithError
from rigsmith.operating.bench import bench as benchmod
from rigsmith.operating.bench import history as benchhistory
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.lifecycle import wait as waitmod
from rigsmith.operating.upgrade import lastgood, rollback
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engine as enginemod
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockdiff, lockhistory, repin
from rigsmith.resolving.lock.lockdiff import human_size
from rigsmith.resolving.model import secondaryfetch
from rigsmith.resolving.model.modelfetch import free_bytes
from rigsmith.spec import Deployment

DEFAULT_THRESHOLD = 0.10
#: A regression must hold in each of this many benches of the new lock (the best one is compared): a host
#: busy with something else for a moment makes one run slower, a slower engine makes every run slower.
BENCH_TRIES = 3
#: A TTFT rise smaller than this is not a regression whatever its ratio: a first token that comes in a few
#: milliseconds varies by more than 10 % with the load of the host alone.
TTFT_SLACK_S = 0.025


class UpgradeRolledBack(RigsmithError):
    """The new lock failed a gate; the last-known-good runs again."""


# -- the bench gate (pure) ----------------------------------------------------------------------------


def one_stream(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The 1-stream run of a bench row (what decode tok/s and TTFT are compared on)."""
    return next((r for r in runs if int(r.get("streams", 0)) == 1), None)


def regressions(old: Mapping[str, Any], new: Mapping[str, Any], threshold: float) -> list[str]:
    """Pure: what got worse beyond ``threshold`` from the last-known-good's 1-stream run to the new one."""
    out = []
    a, b = float(old["mean_stream_decode_tps"]), float(new["mean_stream_decode_tps"])
    if a > 0 and b < a * (1 - threshold):
        out.append(f"decode {b:.1f} tok/s vs {a:.1f} ({(b / a - 1) * 100:+.0f}%, threshold -{threshold:.0%})")
    ta, tb = float(old["ttft_mean_s"]), float(new["ttft_mean_s"])
    if tb > ta * (1 + threshold) and tb - ta > TTFT_SLACK_S:
        out.append(
            f"TTFT {tb * 1000:.0f} ms vs {ta * 1000:.0f} ms"
            + (f" ({(tb / ta - 1) * 100:+.0f}%, threshold +{threshold:.0%})" if ta > 0 else "")
        )
    return out


def baseline(project: Any, spec: Deployment, lock_text: str) -> dict[str, Any] | None:
    """The latest 1-stream bench of ``spec`` under the lock whose text is ``lock_text``."""
    key = benchmod.lock_key(lock_text, spec)
    found = benchhistory.rows(benchmod.results_path(project.root), spec.name)
    rows = [(where, r) for where, r in found if r.get("lock_key") == key]
    if not rows:
        return None
    benchhistory.point(rows[-1][1], key, rows[-1][0])  # a hostile row: one error naming its line
    return one_stream(rows[-1][1].get("runs", []))


# -- the steps ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How the upgrade's own steps run (the CLI's flags)."""

    threshold: float = DEFAULT_THRESHOLD
    memlock: rollback.Memlock = None
    wait_timeout: float | None = None  # default: the recipe's first-boot time x wait.TIMEOUT_FACTOR
    max_tokens: int = 128
    prompt_words: int = benchmod.DEFAULT_PROMPT_WORDS


def wait_ready(ops: lifecycle.Ops, spec: Deployment, timeout: float | None) -> None:
    """The recipe's readiness gates on the running deployment (``invoke wait``)."""
    follower = waitmod.LogFollower(
        argv=lifecycle.logs_argv(ops, deployment=spec.name, follow=True), env=ops.env
    )
    health = f"{benchmod.base_url(spec)}{spec.readiness.health_path}"
    waitmod.wait(
        waitmod.Gates.from_spec(spec),
        follower,
        waitmod.http_health(health),
        timeout=timeout if timeout is not None else waitmod.timeout_for(spec),
        echo=ops.echo,
    )


def bench_once(ops: lifecycle.Ops, spec: Deployment, opt: Options) -> dict[str, Any]:
    """Bench the running deployment (the row is appended, keyed by the current lock); its 1-stream run."""
    summaries, _ = benchmod.bench_deployment(
        ops.project,
        spec.name,
        max_tokens=opt.max_tokens,
        prompt_words=opt.prompt_words,
        show_compare=False,
        echo=ops.echo,
    )
    run = one_stream([vars(s) for s in summaries])
    assert run is not None  # stream_counts always runs 1 stream
    return run


def _fetch(ops: lifecycle.Ops, spec: Deployment) -> None:
    secondaryfetch.fetch_models(ops.project, spec, echo=ops.echo, confirm=None)


def _build(ops: lifecycle.Ops, spec: Deployment) -> None:
    if not spec.engine.build:
        return

    prepared = buildmod.prepare(ops.project, spec.engine.build)
    eng = enginemod.connect(None, ops.env or {})
    try:
        buildmod.build_image(ops.project, eng, image=spec.engine.build, echo=ops.echo, prepared=prepared)
    finally:
        eng.close()


def _running(ops: lifecycle.Ops, name: str) -> bool:
    info = lifecycle.inspect(ops.run, name)
    return bool(info and (info.get("State") or {}).get("Running"))


# -- the whole upgrade ----------------------------------------------------------------------------------


@dataclass
class Report:
    """What an upgrade did."""

    old: int
    new: int | None = None
    changes: list[str] = field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


def _room(spec: Deployment, old: lockmod.Lock, new: lockmod.Lock, free: Callable[[Any], int]) -> None:
    short = []
    for root, need in lastgood.bytes_needed(lastgood.slots(spec, old), lastgood.slots(spec, new)).items():
        have = free(Path(root))
        if need > have:
            short.append(f"{root}: the new snapshot needs {human_size(need)}, {human_size(have)} free")
    if short:
        raise PreflightError(
            f"upgrade of {spec.name}: not enough disk to keep the last-known-good model beside the new one; "
            "nothing was changed:\n" + "\n".join(f"  - {s}" for s in short),
            hint="free space on that filesystem (the old snapshot stays until the new one passes)",
        )


def upgrade(
    ops: lifecycle.Ops,
    *,
    deployment: str | None = None,
    options: Options = Options(),
    free: Callable[[Any], int] | None = None,
) -> Report:
    """Upgrade the deployment to freshly pinned facts, or roll back to the last-known-good and raise
    UpgradeRolledBack saying why."""
    project = ops.project
    spec = project.load(deployment)
    path = project.lock_path
    if not path.exists():
        raise PreflightError(
            "upgrade: there is no rigsmith.lock yet", hint="`invoke pin`, `fetch-model` and `up` first"
        )
    with lockmod.locked(path):  # no change: only the file lock, while the current lock is recorded
        old_n = lockhistory.mark_current(path, "last-known-good before an upgrade")
    old_text = path.read_text(encoding="utf-8")
    old = lockmod.read(path)
    report = Report(old_n)
    staged = _repinned(ops, spec, old, report, free or free_bytes)
    if staged is None:
        return report

    running = _running(ops, spec.name)
    report.before = baseline(project, spec, old_text)
    if report.before is None and running:
        ops.echo(f"upgrade: no bench of lock {old_n} yet; measuring the last-known-good first")
        report.before = bench_once(ops, spec, options)
    _keep_last_good(ops, spec, old, old_n, options)
    with lockhistory.because(lockhistory.current_cause()[0], last_good=old_n):
        repin.adopt(
            project, staged, yes=True, confirm=None, echo=ops.echo, reason=f"upgrade from lock {old_n}"
        )
    report.new = lockhistory.current_number(path)
    _switch(ops, spec, options, report)
    if report.before is None:
        ops.echo("upgrade: no bench of the last-known-good to compare with (it was not running)")
    ops.echo(f"upgrade {spec.name}: lock {old_n} → {report.new} passed" + _numbers(report))
    return report


def _repinned(
    ops: lifecycle.Ops, spec: Deployment, old: lockmod.Lock, report: Report, free: Callable[[Any], int]
) -> repin.StagedProject | None:
    """Pin everything again into a staged project, with the room the new files need checked; None when
    every pinned fact resolved to the current lock. A refusal leaves no staged lock behind."""
    staged = repin.stage(ops.project)
    try:
        repin.pin_all(staged, spec.name, repin=True, echo=ops.echo)
        new = lockmod.read(staged.lock_path)
        report.changes = lockdiff.diff(old, new)
        if not report.changes:
            ops.echo(
                f"upgrade {spec.name}: nothing to upgrade (every pinned fact resolved to lock {report.old})"
            )
            return None
        _room(spec, old, new, free)
    except BaseException:
        staged.lock_path.unlink(missing_ok=True)
        raise
    return staged


def _keep_last_good(
    ops: lifecycle.Ops, spec: Deployment, old: lockmod.Lock, old_n: int, opt: Options
) -> None:
    """Keep the last-known-good's model files (hard links) and image (a tag) until the new one passes."""
    kept = lastgood.keep(lastgood.slots(spec, old))
    plan = lifecycle.plan_for(ops.project, spec.name, memlock=opt.memlock)
    tag = lastgood.keep_image(ops.host, plan.image, spec.name, old_n) if plan.runtime == "container" else None
    ops.echo(
        f"upgrade: last-known-good is lock {old_n}: {kept} model file link(s) kept"
        + (f", image kept as {tag}" if tag else "")
    )


def _switch(ops: lifecycle.Ops, spec: Deployment, options: Options, report: Report) -> None:
    """fetch → build → stop the old → up → wait → bench gate on the adopted lock; on any failure, roll back
    to the last-known-good and raise UpgradeRolledBack naming the step and why."""
    old_n, path = report.old, ops.project.lock_path
    step = "fetch"
    try:
        _fetch(ops, spec)
        step = "build"
        _build(ops, spec)
        report.new = lockhistory.current_number(path)  # with the config patches fetch applied, the build
        step = "stop the old deployment"
        lifecycle.down(ops, deployment=spec.name)
        step = "up"
        lifecycle.up(ops, deployment=spec.name, memlock=options.memlock, yes=True)
        step = "wait (the recipe's readiness gates)"
        wait_ready(ops, spec, options.wait_timeout)
        step = "bench"
        worse = _bench_gate(ops, spec, options, report)
        if worse:
            raise RigsmithError("bench regressed against lock " + str(old_n) + ": " + "; ".join(worse))
    except RigsmithError as err:
        why = f"{step}: {err.message}"
        if step == "up":  # the engine may have died at once: its own last words say why
            why += _log_tail(ops, spec.name)
        _roll_back(ops, spec, old_n, why, options)
        raise UpgradeRolledBack(
            f"upgrade of {spec.name} to lock {report.new} failed and was rolled back to lock {old_n}: {why}",
            hint=f"`invoke lock --diff {old_n},{report.new}` shows what the upgrade changed; "
            f"`invoke rollback --to {report.new}` tries it again by hand",
        ) from None


def _bench_gate(ops: lifecycle.Ops, spec: Deployment, opt: Options, report: Report) -> list[str]:
    """Bench the new lock until its best decode rate and best TTFT so far do not regress against the
    last-known-good, at most BENCH_TRIES times; what still regresses (empty: passed)."""
    worse: list[str] = []
    for _ in range(BENCH_TRIES if report.before else 1):
        run = bench_once(ops, spec, opt)
        best = report.after or run
        report.after = {
            **run,
            "mean_stream_decode_tps": max(best["mean_stream_decode_tps"], run["mean_stream_decode_tps"]),
            "ttft_mean_s": min(best["ttft_mean_s"], run["ttft_mean_s"]),
        }
        worse = regressions(report.before, report.after, opt.threshold) if report.before else []
        if not worse:
            break
    return worse


def _log_tail(ops: lifecycle.Ops, name: str, lines: int = 5) -> str:
    res = ops.run(lifecycle.logs_argv(ops, deployment=name, tail=lines))
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()] if res.code == 0 else []
    return "\n  engine log:\n" + "\n".join(f"  | {ln}" for ln in said) if said else ""


def _numbers(report: Report) -> str:
    a, b = report.before, report.after
    if not b:
        return ""
    said = f"; decode {b['mean_stream_decode_tps']:.1f} tok/s, TTFT {b['ttft_mean_s'] * 1000:.0f} ms"
    if a:
        said += f" (was {a['mean_stream_decode_tps']:.1f} tok/s, {a['ttft_mean_s'] * 1000:.0f} ms)"
    return said


def _roll_back(ops: lifecycle.Ops, spec: Deployment, n: int, why: str, options: Options) -> None:
    ops.echo(f"upgrade failed at {why}; rolling back to lock {n}")
    try:
        target = rollback.check(ops, spec, n, options.memlock)
        rollback.restore(
            ops,
            spec,
            target,
            reason=f"upgrade rolled back: {why.splitlines()[0][:200]}",
            memlock=options.memlock,
        )
        wait_ready(ops, spec, options.wait_timeout)
    except RigsmithError as err:
        raise RigsmithError(
            f"upgrade of {spec.name} failed ({why}) and the rollback to lock {n} failed too: {err.message}",
            hint=f"`invoke rollback --to {n}` after fixing what is named; `invoke lock --history`",
        ) from None
