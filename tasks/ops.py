"""Operations: doctor, up, down, status, logs, wait, bench, proxy-entry. Wiring only (see rigsmith.ops).

rigsmith.ops (httpx, jinja2) loads inside the tasks: invoke imports every task module for every command.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Exit, task

from rigsmith.errors import RigsmithError
from rigsmith.project import TARGETS
from tasks._common import confirm, echo, project, user_errors
from tasks.deploy import _memlock

if TYPE_CHECKING:
    from rigsmith.ops.lifecycle import Ops

_DEP = "deployments/NAME.yaml to act on (optional when there is only one)"
_TARGET = "podman (plain podman run scripts) or quadlet (systemd unit)"
_OUT = "where the target's artifacts live: DIR/<target>/… (default: the checkout)"


def _ops(target: str, out: str | None) -> Ops:
    from rigsmith.ops import lifecycle

    return lifecycle.Ops(
        project(), target=target, out=Path(out) if out else None, env=dict(os.environ), echo=echo
    )


def _int(flag: str, value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise RigsmithError(f"{flag} {value!r} is not a whole number", hint=f"e.g. {flag} 2") from None


def _seconds(flag: str, value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        raise RigsmithError(f"{flag} {value!r} is not a number of seconds", hint=f"e.g. {flag} 900") from None


@task(help={"deployment": _DEP, "target": _TARGET})
@user_errors
def doctor(c, deployment=None, target="podman"):
    """Preflight: one go/no-go table of this host against the deployment's needs."""
    from rich.console import Console

    from rigsmith.ops import doctor as doctormod
    from rigsmith.ops.host import LocalHost, gather

    if target not in TARGETS:
        raise RigsmithError(f"unknown target {target!r}", hint=f"use one of: {', '.join(TARGETS)}")
    from rigsmith.fitreport import fit_check
    from rigsmith.lock import read

    p = project()
    spec = p.load(deployment)
    facts = gather(LocalHost(), model_dir=spec.model.local_dir)
    checks = doctormod.evaluate(spec, facts, target, fit_check(spec, read(p.lock_path), facts, os.environ))
    Console().print(doctormod.table(checks, f"doctor: {spec.name} ({target})"))
    bad = [ch.name for ch in checks if ch.verdict == "no-go"]
    if bad:
        raise Exit(
            f"doctor: NO-GO — {len(bad)} check(s) failed: {', '.join(bad)} (hints in the table)", code=1
        )
    echo("doctor: GO")


@task(
    help={
        "deployment": _DEP,
        "target": _TARGET,
        "image": "container image reference, overriding the spec and the lock",
        "memlock": "override memlock: unlimited, bytes, or host (set none; for hosts that cannot raise it)",
        "out": _OUT,
        "yes": "change existing generated files without asking",
        "dry_run": "print what would change and be started; do nothing",
    }
)
@user_errors
def up(c, deployment=None, target="podman", image=None, memlock=None, out=None, yes=False, dry_run=False):
    """Start the deployment (render-check, start if needed, verify devices and env arrived)."""
    from rigsmith.ops import lifecycle

    lifecycle.up(
        _ops(target, out),
        deployment=deployment,
        image=image,
        memlock=_memlock(memlock),  # type: ignore[arg-type]
        yes=yes,
        confirm=confirm(),
        dry_run=dry_run,
    )


@task(help={"deployment": _DEP, "target": _TARGET, "out": _OUT})
@user_errors
def down(c, deployment=None, target="podman", out=None):
    """Stop the deployment with its grace, then confirm no process of it holds a GPU."""
    from rigsmith.ops import lifecycle

    lifecycle.down(_ops(target, out), deployment=deployment)


@task(help={"deployment": _DEP, "target": _TARGET, "out": _OUT})
@user_errors
def status(c, deployment=None, target="podman", out=None):
    """Show the deployment's container state, whether it runs the current spec, and /health."""
    from rigsmith.ops import lifecycle
    from rigsmith.ops import wait as waitmod

    st = lifecycle.status(_ops(target, out), deployment=deployment, health=waitmod.http_health_url)
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
    if st.service:
        echo("  service: " + ", ".join(f"{k}={v}" for k, v in st.service.items()))


@task(
    help={
        "deployment": _DEP,
        "target": _TARGET,
        "out": _OUT,
        "follow": "keep following new lines",
        "tail": "show only the last N lines",
    }
)
@user_errors
def logs(c, deployment=None, target="podman", out=None, follow=False, tail=None):
    """Show the deployment's engine log (podman logs / journalctl)."""
    from rigsmith.ops import lifecycle

    argv = lifecycle.logs_argv(
        _ops(target, out),
        deployment=deployment,
        follow=follow,
        tail=_int("--tail", tail) if tail is not None else None,
    )
    try:
        code = subprocess.run(argv, check=False).returncode
    except FileNotFoundError:
        raise RigsmithError(
            f"{argv[0]} is not installed", hint="install it, or use the other --target"
        ) from None
    if code:
        raise Exit(f"logs: `{' '.join(argv)}` exited {code}", code=code)


@task(
    help={
        "deployment": _DEP,
        "target": _TARGET,
        "out": _OUT,
        "timeout": "seconds before giving up (default: 2x the recipe's first-boot time)",
        "log_file": "follow this log file instead of the container's log",
        "url": "health URL (default: the deployment's host, port and readiness.health_path)",
    }
)
@user_errors
def wait(c, deployment=None, target="podman", out=None, timeout=None, log_file=None, url=None):
    """Wait until the recipe's readiness gates pass (log lines, KV-cache size, /health)."""
    from rigsmith.ops import bench as benchmod
    from rigsmith.ops import lifecycle
    from rigsmith.ops import wait as waitmod

    ops = _ops(target, out)
    spec = ops.project.load(deployment)
    if log_file:
        follower = waitmod.LogFollower(path=Path(log_file))
    else:
        follower = waitmod.LogFollower(argv=lifecycle.logs_argv(ops, deployment=spec.name, follow=True))
    health = url or f"{benchmod.base_url(spec)}{spec.readiness.health_path}"
    secs = _seconds("--timeout", timeout) if timeout is not None else waitmod.timeout_for(spec)
    res = waitmod.wait(
        waitmod.Gates.from_spec(spec), follower, waitmod.http_health(health), timeout=secs, echo=echo
    )
    echo(
        f"wait: {spec.name} ready after {res.seconds:.0f}s"
        + (f" (GPU KV cache {res.kv_seen:,} tokens)" if res.kv_seen is not None else "")
    )


@task(
    help={
        "deployment": _DEP,
        "url": "OpenAI API base URL (default: the deployment's host and port)",
        "model": "model name to request (default: the first one /v1/models lists)",
        "streams": "comma-separated extra stream counts (1 and the recipe's published counts always run)",
        "max_tokens": "tokens generated per request (default 256)",
        "prompt_words": "prompt length in words (default 512)",
        "chat": "use /v1/chat/completions instead of /v1/completions",
        "compare": "print the comparison with earlier runs and the recipe's published numbers",
    }
)
@user_errors
def bench(
    c,
    deployment=None,
    url=None,
    model=None,
    streams="",
    max_tokens=None,
    prompt_words=None,
    chat=False,
    compare=False,
):
    """Measure decode tok/s (1 and N streams), TTFT and prefill; append results keyed by the lock hash."""
    from rigsmith.ops import bench as benchmod

    counts = [_int("--streams", s) for s in str(streams).split(",") if s.strip()]
    benchmod.bench_deployment(
        project(),
        deployment,
        url=url,
        model=model,
        streams=counts,
        max_tokens=_int("--max-tokens", max_tokens) if max_tokens is not None else 256,
        prompt_words=_int("--prompt-words", prompt_words) if prompt_words is not None else 512,
        chat=chat,
        show_compare=compare,
        echo=echo,
    )


@task(
    help={
        "deployment": _DEP,
        "target": _TARGET,
        "write": "write proxy/NAME/llama-swap.yaml and family.json instead of printing them",
        "yes": "change existing files without asking (with --write)",
    }
)
@user_errors
def proxy_entry(c, deployment=None, target="podman", write=False, yes=False):
    """Emit a llama-swap model entry and the proxy family record for the deployment."""
    from rigsmith import writer
    from rigsmith.ops import proxy

    p = project()
    spec = p.load(deployment)
    if write:
        writer.write(
            proxy.artifacts(spec, p.root, target), yes=yes, confirm=confirm(), echo=echo, root=p.root
        )
        return
    for name, text in proxy.render(spec, target).items():
        echo(f"# ---- {name}")
        echo(text.rstrip("\n"))
