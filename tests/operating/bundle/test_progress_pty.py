"""Long work as a user sees it in a real terminal (issue 27): fetch-model, build and bundle run on a pty
(stdlib ``os.openpty``), and their output is replayed as a terminal shows it (tests/support/terminal.py).

While they run, the progress lines show sizes, rates and time left; when they end, the terminal holds no
half-drawn bar, no escape a terminal would not act on, and the last line is the command's summary. The
Hub stand-in paces one shard so the download lasts long enough to draw; the bundle goes to another
filesystem so the model is copied (with its bar), not hard-linked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.support import services
from tests.support.bundle import cli_env, invoke, must
from tests.support.common import write_project
from tests.support.hubserver import Fault, HubServer
from tests.support.journey import standin_base
from tests.support.models import MiB, invoke_argv, tiny_files
from tests.support.ops import ops_data
from tests.support.podman import Podman
from tests.support.terminal import PtyRun, Screen, run_in_pty

pytestmark = pytest.mark.engine

NAME = "shown"
REPO_ID = "acme/shown"
SHARD = "model-00001-of-00002.safetensors"
#: A size as the bars print it ("3.5/16.0 MiB"), a rate ("10.8 MiB/s"), a time left ("0:00:01").
SIZE = re.compile(r"\b\d+(\.\d+)?/\d+(\.\d+)? (bytes|KiB|MiB|GiB)\b")
RATE = re.compile(r"\b\d+(\.\d+)? (bytes|KiB|MiB|GiB)/s\b")
ETA = re.compile(r"\b\d:\d\d:\d\d\b")


def _ends_clean(run: PtyRun, *summary: str) -> Screen:
    """The command succeeded, and the terminal after it: nothing unknown, no unfinished line, and the last
    lines shown start with ``summary``'s prefixes, in order."""
    screen = Screen.of(run.raw)
    assert run.returncode == 0, run.text[-3000:]
    assert screen.unknown == [], screen.unknown
    assert screen.partial == "", f"left on the cursor's line: {screen.partial!r}"
    last = screen.shown[-len(summary) :]
    assert len(last) == len(summary), screen.shown
    assert all(line.startswith(p) for line, p in zip(last, summary, strict=True)), "\n".join(
        screen.shown[-8:]
    )
    # no bar left behind: only the frames drawn while it ran had one
    assert not any("━" in line for line in screen.shown), "\n".join(screen.shown)
    return screen


def test_fetch_build_and_bundle_show_progress_and_end_clean_in_a_terminal(
    tmp_path: Path, podman: Podman, ops_image: str, other_disk: Path
) -> None:
    with (
        HubServer() as hub,
        services.registry(tmp_path / "registry") as reg,
        services.podman_api_on(podman, reg.host, tmp_path) as api,
    ):
        files = tiny_files(REPO_ID, shards=2, shard_size=4 * MiB)
        sha = hub.repo(REPO_ID).add_commit(files)
        base_ref = standin_base(podman, reg.host, ops_image)
        data = ops_data(tmp_path, NAME)
        data["engine"].pop("image")  # type: ignore[attr-defined]
        data["engine"]["build"] = "shown"  # type: ignore[index]
        data["model"] = {"repo": REPO_ID, "revision": sha, "local_dir": str(tmp_path / "models" / NAME)}
        project = write_project(tmp_path, data)
        home = project.root / "images" / "shown"
        home.mkdir(parents=True)
        (home / "hello.txt").write_text("hello\n")
        image = {
            "version": 1,
            "base": {"name": base_ref.rsplit(":", 1)[0], "tag": "1"},
            "files": [{"src": "hello.txt", "dest": "/opt/hello.txt"}],
            "smoke": ["/bin/sh", "-c", "echo smoke ok"],
        }
        (home / "image.yaml").write_text(yaml.safe_dump(image, sort_keys=False))
        online = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
        must(invoke(project, podman, "pin", **online))
        env = cli_env(project, podman, **online)

        # fetch-model: one shard paced (1 s per MiB) so the bars draw with a rate and a time left
        hub.fault(Fault("slow", SHARD, delay=0.25, after=0))
        fetch = run_in_pty(invoke_argv("fetch-model"), env)
        _ends_clean(fetch, f"{len(files)} files at {sha[:12]}")
        assert SIZE.search(fetch.text) and RATE.search(fetch.text) and ETA.search(fetch.text), fetch.text[
            -2000:
        ]

        # build: the engine's steps as they come, then the lock line
        build = run_in_pty(invoke_argv("build", "--engine", "podman"), {**env, "CONTAINER_HOST": api})
        screen = _ends_clean(build, "lock: builds.shown = ")
        assert any(line.startswith("STEP 1/") for line in screen.shown), "\n".join(screen.shown)

        # bundle onto another filesystem: the model is copied with a bar, then the summary
        bundle = run_in_pty(invoke_argv("bundle", "--out", str(other_disk / "b"), "--targets", "podman"), env)
        _ends_clean(bundle, f"bundle {other_disk / 'b'}: ", "lock sha256 ")
        assert SIZE.search(bundle.text) and RATE.search(bundle.text), bundle.text[-2000:]
