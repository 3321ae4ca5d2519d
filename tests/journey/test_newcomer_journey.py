"""The newcomer's path (issue 36), both seeds as published, through the real CLI in a fresh copy of the
checkout (its shipped deployments and invoke.yaml default included): README's import step, then
docs/guide.md's "Operating a deployment" — `invoke next` says where the deployment stands and which
command comes next, and that command is the one run. Every `invoke …` a command prints is parsed against
the real tasks and this checkout's deployments (tests/test_hints.py); the ones the path needs are run as
printed. Bare commands act on what was just imported, not on invoke.yaml's shipped default; a start this
machine refuses (memlock) names the command that works, and from then on next, deploy --check and up
agree. Real podman with fake CDI GPUs, the Hub stand-in, a git daemon, an asset server and a registry on
127.0.0.1; the engine is the recording stand-in image, the API the streaming stand-in server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.common import FAKE_VENDOR, REPO, invoke_cli
from tests.support.hubserver import HubServer
from tests.support.journey import build_env, build_services, fill_image, recipe_site
from tests.support.models import tiny_files
from tests.support.ops import OPS_IMAGE, free_port, memlock_fixed
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig
from tests.test_hints import commands_in, problem

pytestmark = pytest.mark.engine

#: Seed 000 as published (byte for byte the seed's text): a prose record, no launch command.
SEED_000 = REPO / "examples" / "records" / "flash-next-int4-3x3090.txt"


class Newcomer:
    """A user at a fresh checkout: runs `invoke …`, reads every hint it prints, and checks each one."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, {**env, "COLUMNS": "400"}
        self.seen: list[list[str]] = []

    def run(self, *argv: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        r = invoke_cli(self.root, *argv, env={**self.env, **env}, timeout=600)
        said = r.stdout + r.stderr
        assert "Traceback" not in said, said
        assert (r.returncode == 0) == ok, f"invoke {' '.join(argv)} -> {r.returncode}\n{said}"
        for hint in commands_in(said):
            why = problem(hint, self.root)
            assert why is None, f"`invoke {' '.join(argv)}` printed `invoke {' '.join(hint)}`: {why}"
            self.seen.append(hint)
        return r

    def run_looks(self) -> int:
        """Run every distinct hint seen so far that only looks (next, doctor, status, logs, a deploy
        --check, check-container): each must run to its verdict (0, or doctor's no-go 1), no traceback and
        no parse error. Hints with a word to fill (REF, SOURCE) or that follow (``--follow``) are not run."""
        ran = 0
        for hint in {tuple(h): None for h in self.seen}:
            looks = hint[0] in ("next", "doctor", "status", "logs", "check-container")
            if not (looks or (hint[:1] == ("deploy",) and "--check" in hint)):
                continue
            if any(w.isupper() for w in hint) or "--follow" in hint:
                continue
            r = invoke_cli(self.root, *hint, env=self.env, timeout=600)
            said = r.stdout + r.stderr
            assert r.returncode in (0, 1) and "Traceback" not in said and "No idea what" not in said, said
            ran += 1
        return ran

    def next_command(self) -> list[str]:
        """`invoke next` (bare, as the guide says) and the command it names for the next step."""
        r = self.run("next")
        line = r.stdout.strip().splitlines()[-1]
        assert line.startswith("where: ") and "next: invoke " in line, r.stdout
        return commands_in(line.split("next: ", 1)[1])[0]

    def step(self, expect: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """Run what `invoke next` names (it must be the ``expect`` task), as printed."""
        argv = self.next_command()
        assert argv[0] == expect, argv
        return self.run(*argv, ok=ok, **env)


def _fresh_checkout(base: Path) -> Path:
    """What a newcomer has after cloning: the shipped deployments and images, and invoke.yaml's default."""
    root = base / "rig"
    shutil.copytree(REPO / "deployments", root / "deployments")
    shutil.copytree(REPO / "images", root / "images")
    shutil.copy(REPO / "invoke.yaml", root / "invoke.yaml")
    return root


def _this_rig(spec_path: Path, tmp_path: Path, port: int, gpus: int) -> dict[str, object]:
    """What the user writes into the imported spec for this rig: the model dir, the GPUs (the fake CDI
    vendor here), a free port on loopback, host dirs for the mounts."""
    data = yaml.safe_load(spec_path.read_text())
    data["model"]["local_dir"] = str(tmp_path / "models" / data["name"])
    data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(gpus)]
    data["network"] = {**(data.get("network") or {}), "host": "127.0.0.1", "port": port}
    for i, m in enumerate(data.get("mounts") or []):
        if m.get("kind", "dir") == "dir":
            m["host"] = str(tmp_path / f"mount{i}")
            Path(m["host"]).mkdir()
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def _operate(user: Newcomer, name: str, port: int, podman: Podman) -> None:
    """docs/guide.md's operating section from a fetched, built deployment: next → deploy → up (refused
    here: memlock cannot be raised; its hint works) → wait → bench → next says every stage is done → down."""
    user.step("deploy")
    try:
        up = user.step("up", ok=False) if memlock_fixed() else user.step("up")
        if up.returncode == 1:
            assert podman.run("container", "exists", name, check=False).returncode == 1  # nothing left
            [fix] = [h for h in commands_in(up.stderr) if h[0] == "up" and "--memlock" in h]
            assert user.run(*fix).returncode == 0
            assert user.run("deploy", "--check", "--target", "podman").returncode == 0  # it agrees
        assert user.run_looks() >= 3  # every printed hint that only looks works while it runs
        with Standin(StandinConfig(model_names=("standin",), rate=120.0, ttft=0.01), port=port):
            for argv in commands_in(user.run("next").stdout.splitlines()[-1].split("next: ", 1)[1]):
                assert argv[0] in ("wait", "bench")
                user.run(
                    *argv, *(("--max-tokens", "16", "--prompt-words", "8") if argv[0] == "bench" else ())
                )
        assert user.run("next").stdout.rstrip().endswith("every stage is done")
        down = user.run("down")
        assert f"down {name}: container stopped and removed" in down.stdout
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)


def test_seed_003_newcomer_from_the_recipe_url_to_a_qualified_build_and_back(
    tmp_path: Path, hub_server: HubServer, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    root = _fresh_checkout(tmp_path)
    hub_server.reset()
    with recipe_site() as url, build_services(tmp_path, podman, ops_image) as svc:
        user = Newcomer(root, build_env(podman.env, tmp_path, hub_server.url))
        imp = user.run("import-recipe", url)
        name = "qwen3-8-flash-next-w4a16-merlin"
        assert f"now act on {name}, the newest import" in imp.stdout
        assert len(name) <= 32 and f"--deployment {name}" in imp.stdout
        assert "placeholders set to it (<repo>: /opt/src" in imp.stdout  # not left empty
        assert "→ /opt/src/.vllm-cache-v2.5 (VLLM_CACHE_ROOT: kept on the host" in imp.stdout

        # what import asks to fill: image.yaml's repo and asset URLs (and, here, a base this machine can
        # pull); the spec's rig-specific paths; the recipe's commit is not this test repo's
        fill_image(root / "images" / name / "image.yaml", svc)
        port = free_port()
        _this_rig(root / "deployments" / f"{name}.yaml", tmp_path, port, 4)
        files = tiny_files("halt95/Qwen3.8-Flash-Next-W4A16-Merlin", shards=1)
        files["config.json"] = json.dumps(
            {"architectures": ["Qwen3NextForCausalLM"], "text_config": {}}
        ).encode()
        hub_server.repo("halt95/Qwen3.8-Flash-Next-W4A16-Merlin").add_commit(files)

        # the guide's loop: `invoke next`, then the command it names
        user.step("pin")
        user.step("fetch-model")
        user.step(
            "build", CONTAINER_HOST=svc.api
        )  # the podman API of this test's storage, for the build only
        doc = user.run("doctor", ok=False)  # no NVIDIA driver here: GPUs no-go; the image is go
        assert any(ln.startswith("│ image") and "│ go" in ln for ln in doc.stdout.splitlines()), doc.stdout
        _operate(user, name, port, podman)
    assert {h[0] for h in user.seen} >= {
        "pin",
        "fetch-model",
        "build",
        "deploy",
        "up",
        "wait",
        "bench",
        "next",
    }


def test_seed_000_newcomer_from_the_published_record_to_a_running_deployment_and_back(
    tmp_path: Path, hub_server: HubServer, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    root = _fresh_checkout(tmp_path)
    hub_server.reset()
    record = tmp_path / SEED_000.name
    shutil.copy(SEED_000, record)
    user = Newcomer(root, build_env(podman.env, tmp_path, hub_server.url))
    imp = user.run("import-recipe", str(record), "--yes")
    [name] = {h[h.index("--deployment") + 1] for h in commands_in(imp.stdout) if "--deployment" in h}
    assert f"now act on {name}, the newest import" in imp.stdout and len(name) <= 32
    if "no container image" in imp.stdout:  # the record's image cannot be pulled: the hint re-imports
        [again] = [h for h in commands_in(imp.stdout) if h[:1] == ["deploy"] and "--image" in h]
        assert again[again.index("--image") + 1] == "REF"
        user.run("import-recipe", str(record), "--yes", "--image", OPS_IMAGE)
    spec_path = root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(spec_path.read_text())
    port = free_port()
    gpus = len(data["resources"]["gpus"]["cdi_devices"])
    data = _this_rig(spec_path, tmp_path, port, gpus)
    # what `invoke next` asks first: the record's guesses and generalized paths, filled as a user would
    said = user.run("next").stdout.strip().splitlines()[-1]
    assert said.startswith("where: ") and "fill placeholders" in said, said
    holes = data.get("placeholders") or {}
    assert isinstance(holes, dict) and holes, data
    for token, value in holes.items():
        if value is None:
            holes[token] = str(tmp_path / "files") if token == "<WORKSTATION>" else "1"
    for m in data.get("mounts") or []:  # a file the record needs at its exact size: run.sh makes it sparse
        assert isinstance(m, dict)
        if m.get("kind") == "file":
            m["host"] = str(tmp_path / "files" / Path(str(m["host"])).name)
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    model = data["model"]
    assert isinstance(model, dict)
    files = tiny_files(str(model["repo"]), shards=1)
    hub_server.repo(str(model["repo"])).add_commit(files, sha=model.get("revision"))
    user.step("pin")
    user.step("fetch-model")
    _operate(user, name, port, podman)
