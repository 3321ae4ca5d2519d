"""Opt-ins with meaning: HOST=0.0.0.0 rewrites --host and requires the API key as a secret; the serve
script's own switches reach the engine only when it runs that script."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.importing import importer
from rigsmith.project import Project
from rigsmith.rendering.plan import make
from rigsmith.resolving.lock.lock import Lock
from tests.support.common import REPO
from tests.support.recipes import SEED_RECIPE

SHIPPED = REPO / "deployments" / "flash-next-merlin-4x3090.yaml"
PATH = "deployments/flash-next-merlin-4x3090.yaml"


def _enable(
    spec: specmod.Deployment, *names: str, extra: tuple[specmod.EnvVar, ...] = ()
) -> specmod.Deployment:
    env = tuple(e.model_copy(update={"enabled": True}) if e.name in names else e for e in spec.env)
    return spec.model_copy(update={"env": env + extra})


def test_host_opt_in_rewrites_the_argv_host_and_needs_the_api_key_as_a_secret() -> None:
    spec = _enable(specmod.load(SHIPPED), "HOST")
    with pytest.raises(SpecError) as err:
        make(spec, Lock(), spec_path=PATH)
    assert [p for p, _ in err.value.problems] == ["env.HOST"]
    assert "HOST=0.0.0.0 rewrites --host to 0.0.0.0" in str(err.value)
    assert "{name: VLLM_API_KEY, value: '', secret: true}" in str(err.value)
    assert "(the recipe: then set VLLM_API_KEY)" in str(err.value)

    key = specmod.EnvVar(name="VLLM_API_KEY", value="", secret=True)
    keyed = _enable(specmod.load(SHIPPED), "HOST", extra=(key,))
    plan = make(keyed, Lock(), spec_path=PATH)
    i = plan.command.index("--host")
    assert plan.command[i + 1] == "0.0.0.0" and plan.command.count("--host") == 1
    assert "HOST" not in dict(plan.env) and plan.secret_env == ("VLLM_API_KEY",)
    assert plan.host == "0.0.0.0" and plan.health_url.startswith("http://127.0.0.1:8000")
    # the labels hash the spec as written, not the rewritten copy
    assert plan.spec_sha256 == hashlib.sha256(specmod.dump(keyed).encode()).hexdigest()


def test_script_switches_are_passed_only_when_the_engine_runs_that_script() -> None:
    spec = _enable(specmod.load(SHIPPED), "AUTO_TOPO", "COUNTERS")
    plan = make(spec, Lock(), spec_path=PATH)
    assert "AUTO_TOPO" not in dict(plan.env) and "COUNTERS" not in dict(plan.env)
    script = spec.engine.model_copy(update={"executable": "/opt/merlin/scripts/serve-v2.5.sh"})
    plan = make(spec.model_copy(update={"engine": script}), Lock(), spec_path=PATH)
    assert dict(plan.env)["AUTO_TOPO"] == "1" and dict(plan.env)["COUNTERS"] == "1"


def test_import_marks_the_serve_scripts_switches_and_not_host(tmp_path: Path) -> None:
    root = tmp_path
    (root / "deployments").mkdir()
    dep = importer.import_recipe(Project(root), str(SEED_RECIPE), name="m", echo=lambda _: None)
    marks = {e.name: e.read_by for e in dep.env if e.opt_in}
    assert marks == {"AUTO_TOPO": "scripts/serve-v2.5.sh", "COUNTERS": "scripts/serve-v2.5.sh", "HOST": None}
    assert all(e.read_by is None for e in dep.env if not e.opt_in)
