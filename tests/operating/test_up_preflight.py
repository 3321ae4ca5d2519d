"""Preflight before any host write (issue 24): `up --target quadlet` on a host without systemd as PID 1 or
without podman's quadlet generator refuses before copying the unit into /etc/containers/systemd; a start
that fails after the unit was installed takes the unit back out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigsmith.errors import RigsmithError
from rigsmith.operating.host import LocalHost
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.probes import QUADLET_GENERATORS
from tests.support.common import invoke_cli, standin_deployment, write_project


def _here_has_systemd_and_quadlet() -> bool:
    comm = Path("/proc/1/comm").read_text().strip()
    return comm == "systemd" and any(Path(g).exists() for g in QUADLET_GENERATORS)


@pytest.mark.skipif(_here_has_systemd_and_quadlet(), reason="needs a host without systemd or quadlet")
def test_cli_up_quadlet_without_systemd_refuses_before_writing_anything(tmp_path: Path) -> None:
    name = f"rs-preflight-{os.getpid()}"
    root = write_project(tmp_path, standin_deployment(tmp_path, name=name)).root
    unit = lifecycle.QUADLET_DIR / f"{name}.container"
    try:
        proc = invoke_cli(root, "up", "--target", "quadlet", "--deployment", name, "--ignore-drift", "--yes")
        assert proc.returncode == 1
        assert "refused before writing anything" in proc.stderr and "Traceback" not in proc.stderr
        assert "not systemd" in proc.stderr or "quadlet generator" in proc.stderr
        assert not unit.exists(), "the unit was installed although nothing can start it"
        assert not (root / "quadlet").exists()
    finally:
        unit.unlink(missing_ok=True)


class _SystemdHost(LocalHost):
    """This machine, except that it says PID 1 is systemd and the quadlet generator is installed."""

    def read(self, path: str) -> str | None:
        return "systemd\n" if path == "/proc/1/comm" else super().read(path)

    def size(self, path: str) -> int | None:
        return 1 if path in QUADLET_GENERATORS else super().size(path)


def test_a_failed_start_takes_the_installed_unit_back_out(tmp_path: Path) -> None:
    name = "rs-undo"
    root = write_project(tmp_path, standin_deployment(tmp_path, name=name))
    units = tmp_path / "etc-containers-systemd"
    units.mkdir()
    kept = units / "other.container"
    kept.write_text("[Container]\n")
    # systemctl here fails (PID 1 is not systemd): the start fails after the install.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    (bin_ / "systemctl").chmod(0o755)
    (bin_ / "podman").write_text("#!/bin/sh\necho '[]'\nexit 125\n")
    (bin_ / "podman").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    said: list[str] = []
    ops = lifecycle.Ops(
        root, target="quadlet", env=env, echo=said.append, host=_SystemdHost(env), quadlet_dir=units
    )
    with pytest.raises(RigsmithError) as err:  # root cause first: doctor's row, then what failed after it
        lifecycle.up(ops, deployment=name, yes=True, ignore_drift=True)
    assert "systemctl daemon-reload" in str(err.value)
    assert sorted(p.name for p in units.iterdir()) == ["other.container"]
    assert kept.read_text() == "[Container]\n"
    assert any(f"undone: removed {units / (name + '.container')}" in s for s in said)


def _fake_podman(tmp_path: Path, version_line: str) -> dict[str, str]:
    """A PATH where podman answers ``--version`` with ``version_line`` and fails everything else, and
    systemctl fails (the start fails after the units were rendered)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    (bin_ / "podman").write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version_line}"; exit 0; fi\necho "[]"\nexit 125\n'
    )
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("version_line", "rendered", "said"),
    [
        ("podman version 5.4.2", "5.4.2", "quadlet units for this host's podman 5.4.2 (`podman --version`; "),
        ("podman version 4.3.1", "4.9.3", "this host's podman 4.3.1 has no quadlet"),
    ],
)
def test_up_renders_quadlet_units_for_this_hosts_podman_and_says_which(
    tmp_path: Path, version_line: str, rendered: str, said: str
) -> None:
    name = "rs-hostpodman"
    root = write_project(tmp_path, standin_deployment(tmp_path, name=name))
    spec = root.spec_path(name)
    spec.write_text(spec.read_text() + "podman_version: 4.9.3\n")
    env = _fake_podman(tmp_path, version_line)
    units = tmp_path / "etc-containers-systemd"
    units.mkdir()
    lines: list[str] = []
    ops = lifecycle.Ops(
        root, target="quadlet", env=env, echo=lines.append, host=_SystemdHost(env), quadlet_dir=units
    )
    with pytest.raises(RigsmithError):  # systemctl fails: the units were rendered, the start was not
        lifecycle.up(ops, deployment=name, yes=True, ignore_drift=True)
    assert any(said in line for line in lines), lines
    unit = (root.root / "quadlet" / f"{name}.container").read_text()
    assert f"podman {rendered}" in unit
    # podman 5 reports health to systemd (Notify=healthy); 4.9.3 has no such value
    assert ("Notify=healthy" in unit) == (rendered == "5.4.2")
