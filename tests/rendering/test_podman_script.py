"""Generated scripts: shellcheck-clean, and any argv survives spec → script → shell unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.targets import RenderContext, podman
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import REPO, golden_files, require, run_script

SCRIPTS = golden_files("*/podman/*/*.sh")


def test_golden_scripts_exist() -> None:
    assert len(SCRIPTS) == 4


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_scripts_are_shellcheck_clean(script: Path) -> None:
    proc = subprocess.run(
        [require("shellcheck"), "--severity=style", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


FAKE_PODMAN = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if args[:2] in (["image", "exists"],):
    sys.exit(0)
if args[:2] == ["container", "exists"]:
    sys.exit(1)
if args[:1] == ["run"]:
    with open(os.environ["FAKE_PODMAN_OUT"], "w") as fh:
        json.dump(args, fh)
    sys.exit(0)
sys.exit(3)
"""

# Any text a recipe can carry (no NUL: argv cannot hold it; no surrogates: not text).
#: Any word but a placeholder (``<1>``): that is a value the user fills, and an unfilled one is refused.
WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24).filter(
    lambda w: not specmod.PLACEHOLDER_RE.search(w)
)


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("fakehost")
    (base / "bin").mkdir()
    fake = base / "bin/podman"
    fake.write_text(FAKE_PODMAN)
    fake.chmod(0o755)
    (base / "cdi").mkdir()
    (base / "cdi/gpu.yaml").write_text(
        'cdiVersion: "0.5.0"\nkind: "nvidia.com/gpu"\ndevices:\n'
        + "".join(f'  - name: "{i}"\n' for i in range(4))
    )
    (base / "home/models/Flash-Next-Merlin").mkdir(parents=True)
    (base / "home/src/merlin").mkdir(parents=True)
    return {
        **os.environ,
        "PATH": f"{base / 'bin'}:{os.environ['PATH']}",
        "CDI_SPEC_DIRS": str(base / "cdi"),
        "HOME": str(base / "home"),
        "FAKE_PODMAN_OUT": str(base / "argv.json"),
    }


SEED = specmod.load(REPO / "deployments/flash-next-merlin-4x3090.yaml")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(WORD, max_size=12), env_value=WORD)
def test_any_argv_survives_spec_script_shell(
    fake_host: dict[str, str], tmp_path_factory, args: list[str], env_value: str
) -> None:
    engine = SEED.engine.model_copy(update={"args": tuple(args), "model_arg": None})
    env = (specmod.EnvVar(name="ANY", value=env_value),)
    spec = SEED.model_copy(update={"engine": engine, "env": env, "placeholders": {}})
    spec = specmod.loads(specmod.dump(spec))  # through YAML, as a user's file would be
    assert list(spec.engine.args) == args and spec.env[0].value == env_value
    plan = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml", home=fake_host["HOME"])
    out = tmp_path_factory.mktemp("render")
    ctx = RenderContext(spec=spec, out=out, command="invoke deploy --target podman")
    (run,) = [a for a in podman.render(plan, ctx) if a.path.name == "run.sh"]
    run.path.parent.mkdir(parents=True)
    run.path.write_text(run.content)
    proc = run_script(run.path, fake_host)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(Path(fake_host["FAKE_PODMAN_OUT"]).read_text())
    image_at = argv.index(SEED.engine.image)
    assert argv[image_at + 1 :] == ["serve", *args]
    assert f"ANY={env_value}" in argv[:image_at]


def test_health_path_and_mount_paths_are_never_run_by_the_shell(
    fake_host: dict[str, str], tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    health = f"/health$(touch {pwned}-1)`touch {pwned}-2`;touch {pwned}-3 \"'"
    extra = tmp_path / "my dir, $(touch {pwned}-4) %h `x`"
    extra.mkdir()
    readiness = SEED.readiness.model_copy(update={"health_path": health})
    mounts = (specmod.Mount(host=str(extra), container="/data/x y $P"),)
    spec = specmod.loads(
        specmod.dump(
            SEED.model_copy(
                update={
                    "readiness": readiness,
                    "mounts": mounts,
                    "placeholders": dict.fromkeys(SEED.placeholders, "x"),
                }
            )
        )
    )
    plan = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml", home=fake_host["HOME"])
    ctx = RenderContext(spec=spec, out=tmp_path / "out", command="invoke deploy --target podman")
    (run,) = [a for a in podman.render(plan, ctx) if a.path.name == "run.sh"]
    run.path.parent.mkdir(parents=True)
    run.path.write_text(run.content)
    proc = run_script(run.path, fake_host)
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob("pwned*"))
    assert f"ready when {plan.health_url} answers" in proc.stdout
    argv = json.loads(Path(fake_host["FAKE_PODMAN_OUT"]).read_text())
    assert f"{extra}:/data/x y $P" in argv
