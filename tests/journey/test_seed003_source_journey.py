"""Seed 003 in a container, its engine built from the recipe's source tree, through the real CLI:

recipe URL → import-recipe (image proposed from the notes) → fill image.yaml (repo, asset URLs, base) and
the placeholders → pin (refused while tree.commit names another commit; then commit, assets, base and
model locked) → build from source with Podman's API → fetch-model → deploy podman → up (the stand-in
engine runs from the built image; the KV scales file the env names is in the container) → down; the same
deployment renders for quadlet, compose and kube with the built image. git daemon, the asset server, the
registry, the Hub stand-in: all on 127.0.0.1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import FAKE_VENDOR, invoke_cli
from tests.support.hubserver import HubServer
from tests.support.journey import build_env, build_services, fill_image, recipe_site
from tests.support.models import tiny_files
from tests.support.ops import free_port
from tests.support.podman import Podman
from tests.support.sources import SCALES, git

HUB_REPO = "halt95/Qwen3.8-Flash-Next-W4A16-Merlin"

pytestmark = pytest.mark.engine


def test_seed_003_built_from_its_source_tree_boots_in_a_container(
    tmp_path: Path, hub_server: HubServer, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    root = tmp_path / "rig"
    (root / "deployments").mkdir(parents=True)
    hub_server.reset()
    with recipe_site() as recipe_url, build_services(tmp_path, podman, ops_image) as svc:
        # The base the tree runs on: the stand-in engine image, served by the local registry.
        upstream, base_ref, api = svc.upstream, svc.base, svc.api
        env = build_env(podman.env, tmp_path, hub_server.url)

        # 1. import: no image given; the notes' git clone + release assets become images/merlin
        imp = invoke_cli(root, "import-recipe", recipe_url, "--name", "merlin", env=env, timeout=600)
        assert imp.returncode == 0, imp.stderr
        assert "create  images/merlin/image.yaml" in imp.stdout
        spec_path, image_path = root / "deployments/merlin.yaml", root / "images/merlin/image.yaml"
        assert specmod.load(spec_path).engine.build == "merlin"
        refused = invoke_cli(root, "pin", env=env, timeout=600)
        assert refused.returncode == 1 and "tree.repo: is empty" in refused.stderr, refused.stderr

        # 2. the user fills what the recipe does not say: the repo, the asset URLs, the base; <repo>
        image = fill_image(image_path, svc, drop_commit=False)
        port = free_port()
        data = yaml.safe_load(spec_path.read_text())
        dest = image["tree"]["dest"]
        # import set the placeholders to the tree's place in the image, and kept the compile cache the
        # env puts there on the host (inside the image every new container would start it empty)
        assert data["placeholders"] == {"<repo>": dest, "<vllm tree>": f"{dest}/vllm-v2.5"}
        [cache] = data["mounts"]
        assert cache["container"] == f"{dest}/.vllm-cache-v2.5"
        cache["host"] = str(tmp_path / "vllm-cache")
        (tmp_path / "vllm-cache").mkdir()
        data["model"]["local_dir"] = str(tmp_path / "models" / "Flash-Next-Merlin")
        data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(4)]
        data["network"] = {"host": "127.0.0.1", "port": port}
        spec_path.write_text(specmod.dump(specmod.from_data(data)))

        # 3. pin: the recipe's commit (28cbb72) is not this test repo's, and pin says so
        files = tiny_files(HUB_REPO, shards=1)
        files["config.json"] = json.dumps(
            {"architectures": ["Qwen3NextForCausalLM"], "text_config": {}}
        ).encode()
        model_commit = hub_server.repo(HUB_REPO).add_commit(files)
        mismatch = invoke_cli(root, "pin", env=env, timeout=600)
        assert mismatch.returncode == 1 and "but tree.commit says 28cbb72" in mismatch.stderr, mismatch.stderr
        assert "nothing was locked" in mismatch.stderr and not (root / "rigsmith.lock").exists()  # as said
        image["tree"].pop("commit")
        image_path.write_text(yaml.safe_dump(image, sort_keys=False))
        pin = invoke_cli(root, "pin", env=env, timeout=600)
        assert pin.returncode == 0, pin.stderr
        lock = lockmod.read(root / "rigsmith.lock")
        assert lock.sources["merlin"].commit == git("rev-parse", "v2.5.1^{commit}", cwd=upstream.work)
        assert set(lock.sources["merlin"].assets) == {"source-bundle", "compiled-ops"}
        assert lock.models["merlin"].commit == model_commit and base_ref in lock.images

        # 4. build from source (Podman's API on the journey's storage), fetch the model, render, start
        # (CONTAINER_HOST for this step only: the podman CLI in run.sh would turn remote with it)
        build = invoke_cli(
            root, "build", "--engine", "podman", env={**env, "CONTAINER_HOST": api}, timeout=600
        )
        assert build.returncode == 0, build.stderr + build.stdout
        built = lockmod.read(root / "rigsmith.lock").builds["merlin"]
        assert built.provides == [dest]
        # a local build is pinned by the image ID the lock records: doctor's image row is go, and asks
        # for no second build
        doc = invoke_cli(root, "doctor", env={**env, "COLUMNS": "400"})
        image_row = next(ln for ln in doc.stdout.splitlines() if ln.startswith("│ image"))
        assert "│ go" in image_row and "local build's image ID" in image_row, image_row
        fetch = invoke_cli(root, "fetch-model", env=env, timeout=600)
        assert fetch.returncode == 0, fetch.stderr
        dep = invoke_cli(root, "deploy", "--target", "podman", "--memlock", "host", env=env, timeout=600)
        assert dep.returncode == 0, dep.stderr
        try:
            up = invoke_cli(root, "up", "--memlock", "host", env=env, timeout=600)
            assert up.returncode == 0, up.stderr + up.stdout
            assert "verified merlin: running; 4 CDI device(s)" in up.stdout
            inspect = podman.run("container", "inspect", "--format", "{{.Image}}", "merlin").stdout.strip()
            assert built.image_id.removeprefix("sha256:").startswith(inspect.removeprefix("sha256:")[:12])
            # The KV scales file the env names (required — without it FP8 KV runs at scale 1.0) is there.
            script = 'f="$VLLM_QSA_KV_SCALES"; test -f "$f" && while read -r l; do echo "$l"; done < "$f"'
            show = podman.run("exec", "merlin", "sh", "-c", script)
            assert '"k_scale": 0.5' in show.stdout
            assert podman.run("exec", "merlin", "sh", "-c", "echo $VLLM_QSA_KV_SCALES").stdout.strip() == (
                f"{dest}/{SCALES}"
            )
            # the cache the engine wrote is on the host, where the next container finds it
            podman.run("exec", "merlin", "sh", "-c", f"echo compiled > {dest}/.vllm-cache-v2.5/graph")
            assert (tmp_path / "vllm-cache" / "graph").read_text() == "compiled\n"
            down = invoke_cli(root, "down", env=env, timeout=600)
            assert down.returncode == 0, down.stderr
        finally:
            podman.run("rm", "--force", "--time", "0", "merlin", check=False)

        # 5. the other container targets of this host render the same built image; kube, whose nodes
        # cannot pull a local image ID, names the push step
        for target in ("quadlet", "compose"):
            out = tmp_path / f"out-{target}"
            r = invoke_cli(root, "deploy", "--target", target, "--out", str(out), env=env, timeout=600)
            assert r.returncode == 0, r.stderr
            text = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
            assert built.pinned_ref in text, target
        kube = invoke_cli(root, "deploy", "--target", "kube", "--out", str(tmp_path / "k"), env=env)
        assert kube.returncode == 1 and "no cluster node can pull it" in kube.stderr, kube.stderr
        assert "invoke build --push REGISTRY --deployment merlin" in kube.stderr
