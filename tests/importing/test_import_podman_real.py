"""An imported recipe, hostile values and all, reaches a real podman container literally.

import-recipe (over real HTTP) → the user fills placeholders and points the spec at this machine →
``deploy --target podman`` → the generated run.sh runs the recording stand-in under real podman. The
container's argv and env must be the recipe's, byte for byte.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal, cast

import yaml

from rigsmith import spec as specmod
from rigsmith.importing import importer
from rigsmith.project import Project
from rigsmith.rendering import deploy
from tests.support.common import FAKE_VENDOR, HOST_MEMLOCK, run_script
from tests.support.podman import Podman, parse_recording
from tests.support.recipes import SEED_RECIPE, RecipeServer

NAME = "imported-hostile"
HOSTILE = [
    "$(touch /tmp/rigsmith-import-pwned-1)",
    "`touch /tmp/rigsmith-import-pwned-2`",
    "'; touch /tmp/rigsmith-import-pwned-3; echo '",
    'a "double" and \\back\\slash',
    "line one\nline two\n",
    "${HOME} $PATH *.json ~ !! & | ; < >",
    "",
]


def test_imported_hostile_recipe_runs_with_its_exact_argv_in_real_podman(
    tmp_path: Path, recipe_server: RecipeServer, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    data = json.loads(SEED_RECIPE.read_text(encoding="utf-8"))
    data["command"] += " --served-model-name " + shlex.join(HOSTILE)
    data["env"] = data["env"].replace("HF_HUB_OFFLINE=1", "HOSTILE_ENV=$(id);`id`|x'\"y HF_HUB_OFFLINE=1")
    url = recipe_server.route("/hostile.json", (200, json.dumps(data).encode()))
    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True)
    project = Project(root)

    imported = importer.import_recipe(project, url, name=NAME, image=standin_image, echo=lambda _m: None)
    assert list(imported.engine.args[-len(HOSTILE) :]) == HOSTILE
    assert {e.name: e.value for e in imported.env}["HOSTILE_ENV"] == "$(id);`id`|x'\"y"

    # what the user does next: fill placeholders, point the model dir and the GPUs at this machine
    path = project.spec_path(NAME)
    spec_data = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec_data["placeholders"] = {
        "<repo>": str(tmp_path / "merlin"),
        "<vllm tree>": str(tmp_path / "merlin/v"),
    }
    spec_data["model"]["local_dir"] = str(tmp_path / "models" / "Flash-Next-Merlin")
    spec_data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(4)]
    # the env names files under <repo> (the KV scales, "required"): the user mounts it, or deploy refuses
    repo = tmp_path / "merlin"
    spec_data["mounts"] = [
        *spec_data.get("mounts", []),
        {"host": str(repo), "container": str(repo), "readonly": True},
    ]
    path.write_text(yaml.safe_dump(spec_data, sort_keys=False), encoding="utf-8")
    Path(spec_data["model"]["local_dir"]).mkdir(parents=True)
    repo.mkdir()
    spec = specmod.load(path)

    out = tmp_path / "out"
    deploy.deploy(
        project,
        "podman",
        deployment=NAME,
        out=out,
        memlock=cast(Literal["host"], HOST_MEMLOCK),
        echo=lambda _m: None,
    )
    proc = run_script(out / "podman" / NAME / "run.sh", podman.env)
    try:
        assert proc.returncode == 0, proc.stderr
        rec = parse_recording(podman.logs_until(NAME, "Application startup complete"))
    finally:
        podman.run("rm", "--force", "--time", "0", NAME, check=False)
    assert rec.argv == ["serve", "/models/Flash-Next-Merlin", *imported.engine.args[1:]]
    assert rec.argv[-len(HOSTILE) :] == HOSTILE
    for e in spec.active_env():
        assert rec.env[e.name] == spec.fill(e.value), e.name
    assert rec.env["HOSTILE_ENV"] == "$(id);`id`|x'\"y"
    assert rec.env["VLLM_QSA_KV_SCALES"] == f"{tmp_path / 'merlin'}/scales/qsa_kv_scales_262k.json"
    for opt in ("AUTO_TOPO", "COUNTERS", "HOST"):
        assert opt not in rec.env, f"opt-in {opt} leaked into the container"
    for n in (1, 2, 3):
        assert not Path(f"/tmp/rigsmith-import-pwned-{n}").exists()
