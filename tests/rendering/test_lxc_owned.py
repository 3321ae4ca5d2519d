"""Generated files are owned whole (issue 24): `deploy --target lxc` without --lxc-config, re-run after a
spec change, writes exactly what a fresh render writes — no stale mount, env or mpN line."""

from __future__ import annotations

from pathlib import Path

import yaml

from rigsmith.project import Project
from tests.support.common import invoke_cli
from tests.support.targets import SEEDS


def test_a_rerender_after_a_spec_change_equals_a_fresh_render(seed_project: Project, tmp_path: Path) -> None:
    name = SEEDS[1]
    deploy = ("deploy", "--target", "lxc", "--deployment", name)
    spec_path = seed_project.root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(spec_path.read_text())
    gone_mount = "/srv/extra-data"
    data["mounts"].append({"host": gone_mount, "container": "/extra"})
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = invoke_cli(seed_project.root, *deploy)
    assert proc.returncode == 0, proc.stderr
    conf = seed_project.root / "lxc" / name / "100.conf"
    before = conf.read_text()
    data["mounts"].pop()
    gone_env = next(e for e in data["env"] if e.get("enabled", True) and not e.get("secret"))
    data["env"].remove(gone_env)
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert gone_mount in before and f"lxc.environment: {gone_env['name']}=" in before
    proc = invoke_cli(seed_project.root, *deploy, "--yes")
    assert proc.returncode == 0, proc.stderr
    fresh = tmp_path / "fresh"
    proc = invoke_cli(seed_project.root, *deploy, "--out", str(fresh))
    assert proc.returncode == 0, proc.stderr
    after = conf.read_text()
    assert after == (fresh / "lxc" / name / "100.conf").read_text()
    assert gone_mount not in after and f"lxc.environment: {gone_env['name']}=" not in after
