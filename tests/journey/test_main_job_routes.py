"""The README's main job as a new user meets it: a fresh copy of the repo's deployment (seed 003) and the
engine image shipped beside it, through the real CLI.

The deployment runs engine.image with the recipe's checkout bind-mounted (the checkout route);
images/flash-next-merlin-4x3090/image.yaml is the engine built from the recipe's source tree (the built
route), its repository left to fill. Every place that meets the missing image — run.sh, `invoke build`,
doctor, `invoke next` — names that file and the exact commands; following run.sh's clone hint with the
recipe's repository gets past the checkout check; following the built route (fill, pin, `build --image
--deployment`) switches the deployment to the build, which then renders and starts. The git daemon, the
asset server, the registry and the Hub stand-in are on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import FAKE_VENDOR, REPO, invoke_cli, run_script
from tests.support.hubserver import HubServer
from tests.support.journey import build_env, build_services, fill_image
from tests.support.models import tiny_files
from tests.support.ops import free_port
from tests.support.podman import Podman

pytestmark = pytest.mark.engine

NAME = "flash-next-merlin-4x3090"
D = f"--deployment {NAME}"
HUB_REPO = "halt95/Qwen3.8-Flash-Next-W4A16-Merlin"
#: The built route as every hint words it (the user's next commands, exactly).
BUILD = f"`invoke build --image {NAME} {D}`"
PIN = f"`invoke pin {D}`"


def _fresh_copy(root: Path, tmp: Path, port: int) -> Path:
    """The repo's main job as shipped (spec, its image, invoke.yaml), with what a user sets for this rig:
    the model and checkout paths, the GPUs (the fake CDI vendor here) and a free port."""
    (root / "deployments").mkdir(parents=True)
    spec_path = root / "deployments" / f"{NAME}.yaml"
    shutil.copy(REPO / "deployments" / f"{NAME}.yaml", spec_path)
    shutil.copytree(REPO / "images" / NAME, root / "images" / NAME)
    shutil.copy(REPO / "invoke.yaml", root / "invoke.yaml")
    data = yaml.safe_load(spec_path.read_text())
    data["model"]["local_dir"] = str(tmp / "models" / "Flash-Next-Merlin")
    data["mounts"][0]["host"] = str(tmp / "checkout")
    data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(4)]
    data["network"] = {"host": "127.0.0.1", "port": port}
    spec_path.write_text(specmod.dump(specmod.from_data(data)))
    return spec_path


def _one_line(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_the_main_job_leads_from_a_missing_image_to_a_running_build(
    tmp_path: Path, hub_server: HubServer, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    root = tmp_path / "rig"
    port = free_port()
    spec_path = _fresh_copy(root, tmp_path, port)
    hub_server.reset()
    with build_services(tmp_path, podman, ops_image) as svc:
        env = {**build_env(podman.env, tmp_path, hub_server.url), "COLUMNS": "400"}

        # 1. the README's first command renders the checkout route
        out = tmp_path / "demo"
        dep = invoke_cli(
            root, "deploy", "--target", "podman", "--out", str(out), "--memlock", "host", env=env
        )
        assert dep.returncode == 0, dep.stderr
        assert "localhost/vllm-merlin:v2.5.1 is a local name no registry serves" in dep.stdout
        run = out / "podman" / NAME / "run.sh"
        (tmp_path / "models" / "Flash-Next-Merlin").mkdir(parents=True)

        # 2. no checkout yet: run.sh says to clone the recipe's repository at its ref (a mkdir would start
        # an engine with no tree), or to build instead; the clone it names works
        r = run_script(run, podman.env)
        assert r.returncode == 1 and f"{tmp_path / 'checkout'} does not exist" in r.stderr, r.stderr
        assert f"git clone --branch v2.5.1 REPO {tmp_path / 'checkout'}" in r.stderr and BUILD in r.stderr
        subprocess.run(
            ["git", "clone", "-q", "--branch", "v2.5.1", svc.upstream.url, str(tmp_path / "checkout")],
            check=True,
        )

        # 3. the image: run.sh, `invoke build` and doctor name the proposed image, what to fill, the exact
        # commands, the pull route and the one that works offline
        r = run_script(run, podman.env)
        assert r.returncode == 1 and "image localhost/vllm-merlin:v2.5.1 is not in local storage" in r.stderr
        build = invoke_cli(root, "build", env=env)  # bare, as run.sh used to say: the main job's image
        doctor = invoke_cli(root, "doctor", env=env)
        image_row = next(line for line in doctor.stdout.splitlines() if line.startswith("│ image"))
        for said in (r.stderr, build.stderr, _one_line(doctor.stdout[doctor.stdout.index(image_row) :])):
            text = _one_line(said)
            assert (
                f"fill tree.repo, tree.assets[0].url, tree.assets[1].url in images/{NAME}/image.yaml" in text
            )
            assert PIN in text and BUILD in text, text
            assert "`podman load -i FILE` (localhost/vllm-merlin:v2.5.1 is a local name" in text
            assert "Without a network only the second route works" in text
        assert build.returncode == 1 and "Traceback" not in build.stderr
        assert "no-go" in image_row and doctor.returncode == 1

        # 4. the built route, as the hint says: fill image.yaml (the repo, the asset URLs, a base this
        # machine can pull), drop the commit the recipe names (pin says it is not this repo's), pin
        fill_image(root / "images" / NAME / "image.yaml", svc)
        files = tiny_files(HUB_REPO, shards=1)
        files["config.json"] = json.dumps(
            {"architectures": ["Qwen3NextForCausalLM"], "text_config": {}}
        ).encode()
        hub_server.repo(HUB_REPO).add_commit(files)
        pin = invoke_cli(root, "pin", "--deployment", NAME, env=env, timeout=600)
        assert pin.returncode == 0, pin.stderr
        assert NAME in lockmod.read(root / "rigsmith.lock").sources
        fetch = invoke_cli(root, "fetch-model", env=env, timeout=600)
        assert fetch.returncode == 0, fetch.stderr
        nxt = invoke_cli(root, "next", env=env)  # pinned and fetched: the image is the next step
        assert nxt.returncode == 0 and "NEXT  built" in nxt.stdout and BUILD in nxt.stdout, nxt.stdout

        # 5. build it for the deployment: the spec now runs the build, the checkout mount it replaces gone
        built = invoke_cli(
            root, "build", "--image", NAME, "--deployment", NAME, "--engine", "podman",
            env={**env, "CONTAINER_HOST": svc.api}, timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr + built.stdout
        spec = specmod.load(spec_path)
        assert spec.engine.build == NAME and spec.engine.image is None
        assert [m.container for m in spec.mounts] == []
        assert lockmod.read(root / "rigsmith.lock").builds[NAME].provides == ["/opt/merlin"]

        # 6. from here the usual path: `invoke next` sees the build, render, start, stop
        nxt = invoke_cli(root, "next", env=env)
        assert nxt.returncode == 0 and "done  built" in nxt.stdout, nxt.stdout
        dep = invoke_cli(root, "deploy", "--target", "podman", "--memlock", "host", env=env)
        assert dep.returncode == 0, dep.stderr
        try:
            up = invoke_cli(root, "up", "--memlock", "host", env=env, timeout=600)
            assert up.returncode == 0, up.stderr + up.stdout
            assert f"verified {NAME}: running; 4 CDI device(s)" in up.stdout
            down = invoke_cli(root, "down", env=env, timeout=600)
            assert down.returncode == 0, down.stderr
        finally:
            podman.run("rm", "--force", "--time", "0", NAME, check=False)
