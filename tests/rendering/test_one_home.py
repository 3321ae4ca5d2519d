"""`~` means one home (issue 24): decided once at deploy — the invoking user's, SUDO_USER's under sudo —
and written out explicitly in every target (no run-time $HOME in run.sh, no %h in a system-wide quadlet
unit, the same path in compose, pct.conf, provision.sh and the pod spec)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from rigsmith import userhome
from rigsmith.project import Project
from tests.support.common import invoke_cli
from tests.support.targets import SEEDS

TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")


def test_sudo_user_home_wins_over_roots_home() -> None:
    homes = {"alice": "/home/alice"}
    env = {"HOME": "/root", "SUDO_USER": "alice"}
    assert userhome.invoking_home(env, euid=0, lookup=homes.__getitem__) == "/home/alice"
    assert userhome.invoking_home({"HOME": "/home/bob"}, euid=1000, lookup=homes.__getitem__) == "/home/bob"
    # SUDO_USER set but not running as root (sudo -u bob): bob's own $HOME.
    assert (
        userhome.invoking_home({**env, "HOME": "/home/bob"}, euid=1000, lookup=homes.__getitem__)
        == "/home/bob"
    )
    # An unknown SUDO_USER falls back to $HOME rather than failing.
    assert userhome.invoking_home(
        {"HOME": "/root", "SUDO_USER": "ghost"}, euid=0, lookup=homes.__getitem__
    ) == ("/root")


@pytest.mark.skipif(os.geteuid() != 0, reason="the sudo case is root's")
def test_every_target_writes_the_sudo_users_home_out_explicitly(seed_project: Project) -> None:
    user = "nobody"  # exists on every Debian; its home is the password database's
    home = pwd.getpwnam(user).pw_dir
    env = {**os.environ, "HOME": "/root", "SUDO_USER": user}
    seed = SEEDS[1]  # the seed with ~/ paths (model dir and a source mount)
    for target in TARGETS:
        proc = invoke_cli(seed_project.root, "deploy", "--target", target, "--deployment", seed, env=env)
        assert proc.returncode == 0, proc.stderr
    texts = {
        str(p.relative_to(seed_project.root)): p.read_text()
        for t in TARGETS
        for p in (seed_project.root / t).rglob("*")
        if p.is_file()
    }
    assert texts
    for rel, text in texts.items():
        assert "%h" not in text and "${HOME}" not in text and "$HOME" not in text, rel
        assert "/root/models" not in text and "~/" not in text.replace("# ", ""), rel
    mounted = f"{home}/models/Flash-Next-Merlin"
    for rel, text in texts.items():
        if rel.endswith((".sh", ".container", ".yaml", ".conf")) and "stop.sh" not in rel:
            assert mounted in text, f"{rel} does not name {mounted}"


def test_fetch_model_and_deploy_agree_on_the_home(tmp_path: Path) -> None:
    from rigsmith.resolving.model.modelfiles import expand_dir

    env = {"HOME": "/root", "SUDO_USER": "nobody"}
    if os.geteuid() != 0:
        pytest.skip("the sudo case is root's")
    assert str(expand_dir("~/models/m", env)) == pwd.getpwnam("nobody").pw_dir + "/models/m"
