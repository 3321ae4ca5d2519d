"""What ``up`` takes back when a start fails: the quadlet units it installed, the service systemd keeps
loaded, the container podman created but could not start. Nothing of a failed start is left behind."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rigsmith import writer
from rigsmith.errors import shown
from rigsmith.operating.lifecycle.verify import inspect_argv, parse_inspect
from rigsmith.operating.probes import CmdResult


def previous(path: Path) -> bytes | None:
    """The bytes at ``path`` before ``up`` writes there (None: no file)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def installs(before: Mapping[Path, bytes | None], echo: Callable[[str], None]) -> None:
    """Put the installed units back as they were before ``up`` (a failed start leaves no new unit)."""
    for path, old in before.items():
        try:
            if old is None:
                path.unlink(missing_ok=True)
                echo(f"undone: removed {path} (the start failed)")
            elif path.read_bytes() != old:
                writer.write_one(path, old.decode("utf-8", errors="surrogateescape"))
                echo(f"undone: restored {path} (the start failed)")
        except OSError as err:
            echo(f"warning: could not undo {path}: {err}")


def start(
    run: Callable[[Sequence[str]], CmdResult],
    target: str,
    name: str,
    reload: bool,
    echo: Callable[[str], None],
) -> None:
    """After a start that failed. quadlet: the service stopped (its unit file is gone or restored, but
    systemd keeps a loaded service restarting until told), its failed state reset and the generator rerun
    (``reload``: a unit file was undone). Both: the container ``podman run`` created but could not start
    (an OCI error leaves it "Created") removed."""
    if target == "quadlet":
        unit = f"{name}.service"
        steps = [["systemctl", "stop", unit], ["systemctl", "reset-failed", unit]]
        for argv in [*steps, *([["systemctl", "daemon-reload"]] if reload else [])]:
            res = run(argv)
            if res.code != 0 and argv[1] != "reset-failed":  # a unit that never failed has nothing to reset
                echo(f"warning: could not undo the start: {' '.join(argv)}: {shown(res.stderr.strip())}")
        echo(f"undone: {unit} stopped and reset (the start failed)")
    res = run(inspect_argv(name))
    info = parse_inspect(res.stdout) if res.code == 0 else None
    state = (info or {}).get("State") or {}
    if info is None or state.get("Running"):
        return
    what = f"the {state.get('Status') or 'stopped'} container {name}"
    rm = run(["podman", "rm", "--force", name])
    if rm.code == 0:
        echo(f"undone: removed {what} (the start failed)")
    else:
        echo(f"warning: could not remove {what}: {shown(rm.stderr.strip())}")
