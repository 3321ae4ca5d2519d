"""Exposure is never wider than the recipe's (issue 24): a `docker run -p 127.0.0.1:8000:8000 … --host
0.0.0.0` recipe, imported and deployed through the CLI, really answers on 127.0.0.1 and not on another
address of the machine.

The machine is a network namespace the test creates (tests/support/cluster.py: two namespaces on a veth
pair); the generated run.sh runs real podman inside it (host networking: the container's network is the
namespace's), and the engine is a busybox stand-in that binds exactly as vLLM does: ``--host`` (all
addresses when absent) and ``--port``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import HEAD_IP, two_netns
from tests.support.common import FAKE_VENDOR, REPO, invoke_cli, run_script, write_project
from tests.support.podman import Podman, import_busybox_image

LISTENER_IMAGE = "localhost/rigsmith-listener:1"
#: Seed 000, as shipped (deployments/ generated from examples/records/ and its answers file).
SEED_000 = "flash-next-int4-3x3090"
#: Binds like vLLM's server: --host (every address when absent), --port (8000); readiness line after bind.
LISTENER = """#!/bin/sh
host=; port=8000
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift;;
    --host=*) host=${1#--host=};;
    --port) port=$2; shift;;
    --port=*) port=${1#--port=};;
  esac
  shift
done
mkdir -p /tmp/www && echo ok > /tmp/www/health
httpd -p "${host:+$host:}$port" -h /tmp/www || exit 1
echo "INFO: Application startup complete."
trap 'exit 0' TERM
while :; do sleep 1; done
"""


@pytest.fixture(scope="session")
def listener_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("listener-rootfs")
    return import_busybox_image(
        podman, root, LISTENER_IMAGE, ("sh", "httpd", "mkdir", "echo", "sleep"), LISTENER
    )


@pytest.fixture
def machine() -> Iterator[tuple[str, str]]:
    """(the machine's namespace, another machine's namespace); the first holds HEAD_IP besides loopback."""
    with two_netns(f"rx{os.getpid() % 100000}") as pair:
        yield pair


def _answers(ns: str, url: str) -> bool:
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # curl exit 7: connection refused (nothing listens there); anything else answered or is a test fault.
    assert proc.returncode in (0, 7), proc.stderr
    return proc.returncode == 0 and proc.stdout == "200"


def _import_and_deploy(root: Path, tmp_path: Path, name: str, publish: str, port: int) -> Path:
    models = tmp_path / "srv" / name
    (models / "m").mkdir(parents=True)
    recipe = tmp_path / f"{name}.sh"
    recipe.write_text(
        f"docker run --device {FAKE_VENDOR}=0 -p {publish} -v {models}:/models {LISTENER_IMAGE} \\\n"
        f"  --model /models/m --host 0.0.0.0 --port {port}\n"
    )
    proc = invoke_cli(root, "import-recipe", str(recipe), "--name", name, "--yes")
    assert proc.returncode == 0, proc.stderr
    proc = invoke_cli(
        root, "deploy", "--target", "podman", "--deployment", name, "--memlock", "host", "--yes"
    )
    assert proc.returncode == 0, proc.stderr
    return root / "podman" / name / "run.sh"


def test_a_loopback_only_recipe_answers_on_loopback_and_not_on_another_address(
    tmp_path: Path, podman: Podman, fake_cdi: Path, listener_image: str, machine: tuple[str, str]
) -> None:
    here, other = machine
    root = write_project(tmp_path).root
    # The control: a recipe that publishes on every address must answer on HEAD_IP (so the probe can fail).
    cases = {"exp-loopback": ("127.0.0.1:8000:8000", 8000), "exp-wide": ("8001:8001", 8001)}
    scripts = {name: _import_and_deploy(root, tmp_path, name, *case) for name, case in cases.items()}
    spec = yaml.safe_load((root / "deployments" / "exp-loopback.yaml").read_text())
    assert spec["network"]["listen"] == "127.0.0.1"
    assert any(
        n.startswith("decision: the recipe publishes its API only on 127.0.0.1") for n in spec["notes"]
    )
    try:
        for name, script in scripts.items():
            # nsenter joins the network namespace only: `ip netns exec` remounts /sys, hiding the cgroups.
            proc = run_script(script, podman.env, wrap=("nsenter", f"--net=/run/netns/{here}"))
            assert proc.returncode == 0, proc.stderr
            podman.logs_until(name, "Application startup complete")
        assert _answers(here, "http://127.0.0.1:8000/health")
        assert not _answers(here, f"http://{HEAD_IP}:8000/health"), "loopback-only API answers on HEAD_IP"
        assert not _answers(other, f"http://{HEAD_IP}:8000/health"), "another machine reaches the API"
        assert _answers(here, f"http://{HEAD_IP}:8001/health") and _answers(
            other, f"http://{HEAD_IP}:8001/health"
        )
    finally:
        for name in cases:
            podman.run("rm", "--force", "--time", "0", name, check=False)


def _seed_000_here(tmp_path: Path) -> tuple[Path, Path]:
    """Seed 000's shipped spec (generated from the record) on this machine: the model dir, the fake CDI
    GPUs and the sparse file's directory under tmp_path; the listener image stands in for the patched
    engine (``--image``), everything else as shipped (``--host 127.0.0.1 --port 8001``)."""
    data = yaml.safe_load((REPO / "deployments" / "flash-next-int4-3x3090.yaml").read_text())
    data["model"]["local_dir"] = str(tmp_path / "models" / "flash-next")
    Path(data["model"]["local_dir"]).mkdir(parents=True)
    data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(3)]
    [ple] = data["mounts"]
    ple["host"] = str(tmp_path / "flash-next" / "ngram_table.bin")
    root = write_project(tmp_path, data).root
    proc = invoke_cli(
        root,
        *("deploy", "--target", "podman", "--deployment", SEED_000, "--image", LISTENER_IMAGE),
        *("--memlock", "host", "--yes"),
    )
    assert proc.returncode == 0, proc.stderr
    return root / "podman" / SEED_000 / "run.sh", Path(ple["host"])


def test_seed_000_answers_on_loopback_only_and_its_sparse_file_is_a_file(
    tmp_path: Path, podman: Podman, fake_cdi: Path, listener_image: str, machine: tuple[str, str]
) -> None:
    """Seed 000 ("container on localhost"), as imported from the published record: its run.sh on real
    podman answers on 127.0.0.1:8001 and not on the machine's other address, from it or from a second
    namespace; the PLE file (pitfall 2) is created sparse at its exact size and mounted as a file; a
    directory or a file of another size in its place is refused before anything starts."""
    here, other = machine
    script, ple = _seed_000_here(tmp_path)
    in_ns = ("nsenter", f"--net=/run/netns/{here}")
    try:
        proc = run_script(script, podman.env, wrap=in_ns)
        assert proc.returncode == 0, proc.stderr
        podman.logs_until(SEED_000, "Application startup complete")
        assert _answers(here, "http://127.0.0.1:8001/health")
        assert not _answers(here, f"http://{HEAD_IP}:8001/health"), "seed 000's API answers on HEAD_IP"
        assert not _answers(other, f"http://{HEAD_IP}:8001/health"), "another machine reaches seed 000"
        st = ple.stat()
        assert ple.is_file() and st.st_size == 102400491520 and st.st_blocks * 512 < 2**20  # sparse
        inside = podman.run("exec", SEED_000, "sh", "-c", "test -f /workstation/ngram_table.bin", check=False)
        assert inside.returncode == 0, "the PLE mount is not a file in the container"
    finally:
        podman.run("rm", "--force", "--time", "0", SEED_000, check=False)
    for wrong in ("dir", "size"):
        ple.unlink() if ple.is_file() else ple.rmdir()
        if wrong == "dir":
            ple.mkdir()
        else:
            ple.write_bytes(b"stale")
        proc = run_script(script, podman.env, wrap=in_ns)
        assert proc.returncode == 1 and str(ple) in proc.stderr, proc.stderr
        assert podman.run("container", "exists", SEED_000, check=False).returncode == 1
