"""Operations: doctor, up, down, status, logs, wait, bench, proxy-entry. Wiring only (see rigsmith.operating).

rigsmith.operating (httpx, jinja2) loads inside the tasks: invoke imports every task module for every command.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from rigsmith import writer
from rigsmith.cli.flags import DEPLOYMENT, IMAGE, MEMLOCK, OUT, RUN_TARGET, TARGET, YES, helps, seconds, whole
from rigsmith.cli.wiring import confirm, echo, project, user_errors
from rigsmith.errors import RigsmithError, shown

if TYPE_CHECKING:
    from rigsmith.operating.lifecycle.lifecycle import Ops
    from rigsmith.operating.lifecycle.status import Status


def _ops(c: Context, target: str, out: str | None) -> Ops:
    from rigsmith.operating.lifecycle import lifecycle

    return lifecycle.Ops(
        project(c), target=target, out=Path(out) if out else None, env=dict(os.environ), echo=echo
    )


@task(
    help={
        **helps(DEPLOYMENT, TARGET),
        "verify": "hash every model file against rigsmith.lock (default: sizes + fetch-model's cache)",
        "node": "multi-node: check only this node, as this machine (run it on each node)",
    }
)
@user_errors
def doctor(
    c: Context,
    deployment: str | None = None,
    target: str = "podman",
    verify: bool = False,
    node: str | None = None,
) -> None:
    """Preflight: one go/no-go table of this host (each node, and the cluster) against the deployment."""
    from rigsmith.operating.doctor import doctor as doctormod
    from rigsmith.operating.host import LocalHost

    target = TARGET.of(target)
    # The text the golden doctor tables hold, at the terminal's width.
    width = shutil.get_terminal_size((160, 24)).columns
    p = project(c)
    if p.load(deployment).cluster is not None:
        from rigsmith.operating.cluster import doctor as clusterdoctor

        tables = clusterdoctor.diagnose_project(p, deployment, target=target, verify=verify, only=node)
    else:
        name, checks = doctormod.diagnose(p, deployment, target=target, host=LocalHost(), verify=verify)
        tables = [(f"doctor: {name} ({target})", checks)]
    for title, rows in tables:
        echo(doctormod.render(rows, title, width=width).rstrip("\n"))
    bad = [ch.name for _t, rows in tables for ch in rows if ch.verdict == "no-go"]
    if bad:
        raise Exit(
            f"doctor: NO-GO — {len(bad)} check(s) failed: {', '.join(bad)} (hints in the table)", code=1
        )


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET, IMAGE, MEMLOCK, OUT, YES),
        "dry_run": "print what would change and be started; do nothing",
        "ignore_drift": "start even when the model dir or the image differ from rigsmith.lock",
        "offline": "start inside a network namespace with only loopback (no route out), after checking that "
        "everything up would fetch is here; wait for the gates from inside it; fail naming the step and "
        "every host:port it tried to reach (podman target, root)",
    }
)
@user_errors
def up(
    c: Context,
    deployment: str | None = None,
    target: str = "podman",
    image: str | None = None,
    memlock: str | None = None,
    out: str | None = None,
    yes: bool = False,
    dry_run: bool = False,
    ignore_drift: bool = False,
    offline: bool = False,
) -> None:
    """Start the deployment (render-check, start if needed, verify devices and env arrived)."""
    from rigsmith.operating.lifecycle import lifecycle
    from rigsmith.operating.lifecycle.keptflags import keep_flags

    mem = MEMLOCK.value(memlock)
    if not dry_run:  # --memlock and --image shape the artifacts: the spec keeps them, so later commands agree
        keep_flags(project(c), deployment, echo, memlock=mem, image=None if offline else image)
    if offline:
        from rigsmith.operating.bundle import offline as offlinemod

        given = [
            f for f, v in (("--image", image), ("--dry-run", dry_run), ("--ignore-drift", ignore_drift)) if v
        ]
        if given:
            raise RigsmithError(
                f"--offline starts exactly what rigsmith.lock pins; it does not take {', '.join(given)}",
                hint="leave those out, or run `invoke up` without --offline",
            )
        report = offlinemod.up_offline(
            _ops(c, target, out), deployment=deployment, memlock=mem, yes=yes, confirm=confirm()
        )
        echo(report.summary())
        return
    lifecycle.up(
        _ops(c, target, out),
        deployment=deployment,
        image=image,
        memlock=mem,
        yes=yes,
        confirm=confirm(),
        dry_run=dry_run,
        ignore_drift=ignore_drift,
    )


@task(help=helps(DEPLOYMENT, RUN_TARGET, OUT))
@user_errors
def down(c: Context, deployment: str | None = None, target: str = "podman", out: str | None = None) -> None:
    """Stop the deployment with its grace, then confirm no process of it holds a GPU."""
    from rigsmith.operating.bundle import offline
    from rigsmith.operating.lifecycle import lifecycle

    ops = _ops(c, target, out)
    lifecycle.down(ops, deployment=deployment)
    offline.release(ops, deployment)


@task(help=helps(DEPLOYMENT, RUN_TARGET, OUT))
@user_errors
def status(c: Context, deployment: str | None = None, target: str = "podman", out: str | None = None) -> None:
    """Show the deployment's container state, whether it runs the current spec, and /health."""
    from rigsmith.operating.lifecycle import lifecycle
    from rigsmith.operating.lifecycle import status as statusmod
    from rigsmith.operating.lifecycle import wait as waitmod

    ops = _ops(c, target, out)
    cluster = lifecycle.cluster_of(ops, deployment)
    if cluster is not None:
        from rigsmith.operating.cluster import lifecycle as clusterlife

        ray = {True: "in the Ray cluster", False: "NOT in the Ray cluster", None: "-"}
        nodes = clusterlife.status(cluster)
        for n in nodes:
            echo(f"{n.name} ({n.role}, {n.address}, {n.how}): {n.state}; {ray[n.in_ray]}")
            if n.problem:
                echo(f"  {n.problem[0]}\n  hint: {n.problem[1]}")
        lost = [n.name for n in nodes if n.problem]
        if lost:
            raise Exit(f"status: node(s) {', '.join(lost)} cannot be reached (fix above)", code=1)
        return
    st = statusmod.status(ops, deployment=deployment, health=waitmod.http_health_url)
    spec = {
        True: "current spec",
        False: "STALE spec (run `invoke down` then `invoke up`)",
        None: "spec unknown",
    }
    health = {True: "healthy", False: "not answering /health", None: "-"}
    echo(
        f"{st.name}: {st.state}"
        + (f" since {st.started}" if st.started else "")
        + (f"; {st.image}; {spec[st.spec_current]}; {health[st.healthy]}" if st.state != "absent" else "")
    )
    if st.state != "absent":
        echo("  " + _lock_line(st))
    if st.service:
        echo("  service: " + ", ".join(f"{k}={v}" for k, v in st.service.items()))


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET, OUT),
        "follow": "keep following new lines",
        "tail": "show only the last N lines",
        "node": "multi-node: the node whose engine log to show (default: the head), reached as `up` does",
    }
)
@user_errors
def logs(
    c: Context,
    deployment: str | None = None,
    target: str = "podman",
    out: str | None = None,
    follow: bool = False,
    tail: str | None = None,
    node: str | None = None,
) -> None:
    """Show the deployment's engine log (podman logs / journalctl)."""
    from rigsmith.operating.cluster import lifecycle as clusterlife
    from rigsmith.operating.host import LocalHost
    from rigsmith.operating.lifecycle import lifecycle, rootcause

    lines = whole("--tail", tail) if tail is not None else None
    ops = _ops(c, target, out)
    name = ops.project.resolve_name(deployment)
    cluster = lifecycle.cluster_of(ops, name)
    if cluster is not None:
        argv = clusterlife.logs_argv(cluster, node, follow=follow, tail=lines)
    else:
        rootcause.require_running(ops.project, name, target, ops.host, "show logs of")
        argv = lifecycle.logs_argv(ops, deployment=name, follow=follow, tail=lines)
    try:
        code = LocalHost().call(argv)
    except FileNotFoundError:
        raise RigsmithError(
            f"{argv[0]} is not installed", hint="install it, or use the other --target"
        ) from None
    if code:
        raise Exit(f"logs: `{' '.join(argv)}` exited {code}", code=code)


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET, OUT),
        "timeout": "seconds before giving up (default: 2x the recipe's first-boot time)",
        "log_file": "follow this log file instead of the container's log",
        "url": "health URL (default: the deployment's host, port and readiness.health_path)",
    }
)
@user_errors
def wait(
    c: Context,
    deployment: str | None = None,
    target: str = "podman",
    out: str | None = None,
    timeout: str | None = None,
    log_file: str | None = None,
    url: str | None = None,
) -> None:
    """Wait until the recipe's readiness gates pass (log lines, KV-cache size, /health)."""
    from rigsmith.operating.bench import bench as benchmod
    from rigsmith.operating.lifecycle import lifecycle, rootcause
    from rigsmith.operating.lifecycle import wait as waitmod

    ops = _ops(c, target, out)
    spec = ops.project.load(deployment)
    secs = seconds("--timeout", timeout) if timeout is not None else waitmod.timeout_for(spec)
    cluster = lifecycle.cluster_of(ops, spec.name) if not (log_file or url) else None
    if cluster is not None:  # every node's join, then the head's gates, each reached as `up` does
        from rigsmith.operating.cluster import lifecycle as clusterlife

        res = clusterlife.wait(cluster, secs, echo)
        echo(f"wait: {spec.name} ready after {res.seconds:.0f}s (all {len(cluster.nodes)} nodes joined)")
        return
    if log_file:
        follower = waitmod.LogFollower(path=Path(log_file))
    else:
        rootcause.require_running(ops.project, spec.name, target, ops.host, "wait for")
        follower = waitmod.LogFollower(argv=lifecycle.logs_argv(ops, deployment=spec.name, follow=True))
    health = url or f"{benchmod.base_url(spec)}{spec.readiness.health_path}"
    try:
        res = waitmod.wait(
            waitmod.Gates.from_spec(spec), follower, waitmod.http_health(health), timeout=secs, echo=echo
        )
    except RigsmithError as err:  # root cause first: doctor's failing row leads the engine's last words
        if log_file:
            raise
        blocker = rootcause.first_blocker(ops.project, spec.name, target, ops.host, skip=("memlock",))
        raise rootcause.lead(err, blocker, spec.name, target) from None
    echo(
        f"wait: {spec.name} ready after {res.seconds:.0f}s"
        + (f" (GPU KV cache {res.kv_seen:,} tokens)" if res.kv_seen is not None else "")
    )
    if res.kv_seen is not None:  # the engine's own number, for `invoke fit` to show beside its estimate
        from rigsmith.operating.fit import observed
        from rigsmith.resolving.lock import lock

        observed.record(ops.project.root, spec, lock.read(ops.project.lock_path), res.kv_seen)


@task(
    help={
        **helps(DEPLOYMENT),
        "url": "OpenAI API base URL (default: the deployment's host and port)",
        "model": "model name to request (default: the first one /v1/models lists)",
        "streams": "comma-separated extra stream counts (1 and the recipe's published counts always run)",
        "max_tokens": "tokens generated per request (default 256, the workload --compare needs)",
        "prompt_words": "prompt length in words (default 512, the workload --compare needs)",
        "chat": "use /v1/chat/completions instead of /v1/completions",
        "compare": "compare with earlier runs, and with the recipe's published numbers when this deployment "
        "runs from this lock at the default workload (else say why not)",
        "history": "measure nothing: chart decode tok/s and TTFT per lock over time, upgrades marked",
        "out": "with --history: write the chart to FILE (.svg; default .rigsmith/charts/NAME.svg)",
        "yes": "with --out: replace FILE when it exists (else rigsmith asks, or refuses without a terminal)",
    }
)
@user_errors
def bench(
    c: Context,
    deployment: str | None = None,
    url: str | None = None,
    model: str | None = None,
    streams: str = "",
    max_tokens: str | None = None,
    prompt_words: str | None = None,
    chat: bool = False,
    compare: bool = False,
    history: bool = False,
    out: str | None = None,
    yes: bool = False,
) -> None:
    """Measure decode tok/s (1 and N streams), TTFT and prefill; append results keyed by the lock hash."""
    from rigsmith.operating.bench import bench as benchmod
    from rigsmith.operating.bench import gate as benchgate
    from rigsmith.operating.host import LocalHost

    if history or out:
        from rigsmith.operating.bench import history as benchhistory

        p = project(c)
        spec = p.load(deployment)
        pts, mks = benchhistory.points(p.root, p.lock_path, spec), benchhistory.marks(p.lock_path)
        for line in benchhistory.terminal(pts, mks):
            echo(line)
        if out or pts:
            title = f"{spec.name}: decode tok/s and TTFT per lock"
            to = Path(out) if out else benchhistory.default_chart(p.root, spec.name)
            # the default file is rigsmith's own (replaced freely); a file the user named is asked about
            wrote = benchhistory.write_chart(
                pts, mks, to, title, replace=yes or not out, confirm=confirm() if out else None
            )
            echo(f"bench: chart written to {shown(str(wrote))}")
        return

    counts = [whole("--streams", s) for s in str(streams).split(",") if s.strip()]
    tokens = benchgate.PUBLISHED_MAX_TOKENS if max_tokens is None else whole("--max-tokens", max_tokens)
    words = benchmod.DEFAULT_PROMPT_WORDS if prompt_words is None else whole("--prompt-words", prompt_words)
    p = project(c)
    name = p.resolve_name(deployment)
    _summaries, comparisons = benchmod.bench_deployment(
        p,
        name,
        url=url,
        model=model,
        streams=counts,
        max_tokens=tokens,
        prompt_words=words,
        chat=chat,
        show_compare=False,
        echo=echo,
    )
    if compare:  # a PASS only for this deployment, running from this lock, at the recipe's workload
        host = LocalHost(dict(os.environ))
        reasons = benchgate.why_not(p, name, host, url=url, max_tokens=tokens, prompt_words=words)
        for line in benchgate.lines(comparisons, reasons):
            echo(line)


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET),
        "write": "write proxy/NAME/llama-swap.yaml and family.json instead of printing them",
        "yes": "change existing files without asking (with --write)",
    }
)
@user_errors
def proxy_entry(
    c: Context, deployment: str | None = None, target: str = "podman", write: bool = False, yes: bool = False
) -> None:
    """Emit a llama-swap model entry and the proxy family record for the deployment."""
    from rigsmith.operating.lifecycle import proxy

    p = project(c)
    spec = p.load(deployment)
    if write:
        writer.write(
            proxy.artifacts(spec, p.root, target), yes=yes, confirm=confirm(), echo=echo, root=p.root
        )
        return
    for name, text in proxy.render(spec, target).items():
        echo(f"# ---- {name}")
        echo(text.rstrip("\n"))


def _lock_line(st: Status) -> str:
    """Which lock the container runs, from its labels (foreign text: errors.shown)."""
    if st.lock_sha256 is None:
        return "lock: the container carries no lock label (started before rigsmith labelled it)"
    which = f"lock {shown(st.lock_entry)} " if st.lock_entry else "lock (no history entry) "
    now = {
        True: "what rigsmith.lock pins now",
        False: "NOT what rigsmith.lock pins now (`invoke down` then `invoke up`, or `invoke rollback`)",
        None: "-",
    }
    return f"{which}(sha256 {shown(st.lock_sha256)}…); {now[st.lock_current]}"
