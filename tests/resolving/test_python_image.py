"""The seed-000 shape for real: pinned pip installs and a patch applied to an installed Python package.

The base carries a real CPython (the host's Debian python3.11 and pip) and a stand-in package ``fakevllm``;
pip installs an exact pin from a PEP 503 index on 127.0.0.1 (the build runs with host networking).
"""

from __future__ import annotations

import base64
import difflib
import functools
import hashlib
import io
import threading
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rigsmith.errors import AdapterError
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engine as enginemod
from rigsmith.resolving.image import registry as registrymod
from rigsmith.resolving.lock import lock as lockmod
from tests.support import services

pytestmark = pytest.mark.engine

PATCHED = services.FAKEVLLM.replace('return "stock"', 'return "patched"')


def _wheel() -> tuple[str, bytes]:
    """rigsmith_probe 1.0 as a pure-Python wheel, RECORD hashes included."""
    files = {
        "rigsmith_probe/__init__.py": b'VERSION = "1.0"\n',
        "rigsmith_probe-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: rigsmith-probe\nVersion: 1.0\n"
        ),
        "rigsmith_probe-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: rigsmith-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "rigsmith_probe-1.0.dist-info/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in {**files, "rigsmith_probe-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(zipfile.ZipInfo(name, (2000, 1, 1, 0, 0, 0)), data)
    return "rigsmith_probe-1.0-py3-none-any.whl", buf.getvalue()


@pytest.fixture(scope="module")
def pip_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 simple index on 127.0.0.1 serving one wheel; yields its /simple URL."""
    root = tmp_path_factory.mktemp("pip-index")
    name, data = _wheel()
    (root / "files").mkdir()
    (root / "files" / name).write_bytes(data)
    (root / "simple" / "rigsmith-probe").mkdir(parents=True)
    sha = hashlib.sha256(data).hexdigest()
    (root / "simple" / "rigsmith-probe" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="/files/{name}#sha256={sha}">{name}</a></body></html>\n'
    )

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def pybase(
    podman_api: services.PodmanService,
    registry: services.LocalRegistry,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """REGISTRY/pybase:1 — busybox + CPython + pip + fakevllm."""
    root = services.python_rootfs(tmp_path_factory.mktemp("pybase") / "rootfs")
    return services.push_rootfs(podman_api, registry, root, "pybase:1")


def _project(tmp_path: Path, base: str, index: str) -> Project:
    name, _, tag = base.rpartition(":")
    home = tmp_path / "project" / "images" / "pyimg"
    (home / "patches").mkdir(parents=True)
    (tmp_path / "project" / "deployments").mkdir()
    diff = difflib.unified_diff(
        services.FAKEVLLM.splitlines(keepends=True),
        PATCHED.splitlines(keepends=True),
        "a/fakevllm/__init__.py",
        "b/fakevllm/__init__.py",
    )
    (home / "patches" / "mode.patch").write_text("".join(diff))
    definition = {
        "base": {"name": name, "tag": tag},
        "pip": ["rigsmith-probe==1.0"],
        "build_args": {"PIP_INDEX_URL": index, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        "patches": [
            {"slot": "mode", "file": "patches/mode.patch", "target": "python-package", "package": "fakevllm"}
        ],
        "smoke": [
            "python3",
            "-c",
            "import fakevllm, rigsmith_probe; assert fakevllm.mode() == 'patched'; "
            "print('smoke:', fakevllm.mode(), rigsmith_probe.VERSION)",
        ],
    }
    (home / "image.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
    return Project(tmp_path / "project")


def test_pip_pin_and_python_package_patch_in_a_real_build(
    tmp_path: Path, pybase: str, pip_index: str, podman_api: services.PodmanService
) -> None:
    project = _project(tmp_path, pybase, pip_index)
    reg = registrymod.Registry({})
    buildmod.pin_images(project, reg, echo=lambda _: None)
    reg.close()
    eng = enginemod.connect("podman", {"CONTAINER_HOST": podman_api.url})
    lines: list[str] = []
    try:
        built = buildmod.build_image(project, eng, image="pyimg", echo=lines.append)
    finally:
        eng.close()
    log = "\n".join(lines)
    assert "Successfully installed rigsmith-probe-1.0" in log
    assert "apply-patch: applied mode.patch in /usr/lib/python3/dist-packages" in log
    assert "smoke: patched 1.0" in log
    out = podman_api.cli(
        "run", "--rm", "--network", "none", built.image_id, "python3", "-c",
        "import fakevllm, rigsmith_probe; print(fakevllm.mode(), rigsmith_probe.VERSION, fakevllm.__file__)",
    ).stdout.decode()  # fmt: skip
    assert out == "patched 1.0 /usr/lib/python3/dist-packages/fakevllm/__init__.py\n"
    assert lockmod.read(project.lock_path).builds["pyimg"].patches == {
        "images/pyimg/patches/mode.patch": "sha256:"
        + hashlib.sha256((project.images / "pyimg" / "patches" / "mode.patch").read_bytes()).hexdigest()
    }


def test_python_package_patch_on_a_missing_package_fails_clearly(
    tmp_path: Path, pybase: str, pip_index: str, podman_api: services.PodmanService
) -> None:
    project = _project(tmp_path, pybase, pip_index)
    path = project.images / "pyimg" / "image.yaml"
    data = yaml.safe_load(path.read_text())
    data["patches"][0]["package"] = "notinstalled"
    data["pip"] = []
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    reg = registrymod.Registry({})
    buildmod.pin_images(project, reg, echo=lambda _: None)
    reg.close()
    eng = enginemod.connect("podman", {"CONTAINER_HOST": podman_api.url})
    lines: list[str] = []
    try:
        with pytest.raises(AdapterError, match="podman build failed"):
            buildmod.build_image(project, eng, image="pyimg", echo=lines.append)
    finally:
        eng.close()
    assert "apply-patch: cannot locate python package notinstalled with python3" in "\n".join(lines)
