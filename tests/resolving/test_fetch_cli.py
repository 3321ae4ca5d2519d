"""`invoke fetch-model` as a user runs it: separate processes, kill -9, concurrency, error output."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from rigsmith.resolving.lock import lock as lockmod
from tests.support.hubserver import Fault, random_bytes
from tests.support.models import MiB, cli_env, invoke_argv, partial_name, run_cli, tiny_files

BIG = "model-00001-of-00001.safetensors"


def _big_repo(hub, repo_id: str) -> tuple[str, dict[str, bytes]]:
    # Over huggingface_hub's 10 MiB write chunk, so a killed download leaves bytes to resume from.
    files = tiny_files(repo_id, shards=0)
    files[BIG] = random_bytes(repo_id, 12 * MiB + 12345)
    return hub.repo(repo_id).add_commit(files), files


def test_resume_after_kill_9_mid_file(hub, make_project):
    sha, files = _big_repo(hub, "acme/killed")
    project, spec = make_project(repo="acme/killed", revision=sha)
    root = Path(spec.model.local_dir)
    part = root / ".rigsmith/partial" / partial_name(BIG, files[BIG])
    # Slow the body down after the first 10 MiB so the kill lands mid-file.
    hub.fault(Fault("slow", BIG, delay=0.5, after=10 * MiB + 1))

    proc = subprocess.Popen(
        invoke_argv("fetch-model"), env=cli_env(hub, project), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size >= 10 * MiB):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    have = part.stat().st_size
    assert 10 * MiB <= have < len(files[BIG])
    assert not (root / BIG).exists()  # nothing unverified at the real path

    hub.reset()
    done = run_cli(hub, project, "fetch-model", "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert (root / BIG).read_bytes() == files[BIG]
    # The killed run's connection may still be draining; count only the new request's bytes.
    (resumed,) = hub.hub_requests(BIG)
    assert resumed.range == f"bytes={have}-"
    assert resumed.sent == len(files[BIG]) - have
    # The report sums every partial file the killed run left (a small file may have been mid-write too).
    said = re.search(r"([0-9.]+) MiB resumed", done.stdout)
    assert said is not None and float(said.group(1)) >= round(have / MiB, 1) - 0.05, done.stdout
    assert not part.exists()


def test_concurrent_fetches_do_not_corrupt_each_other(hub, make_project):
    sha, files = _big_repo(hub, "acme/together")
    project, spec = make_project(repo="acme/together", revision=sha)
    hub.fault(Fault("slow", BIG, delay=0.05, after=0))
    procs = [
        subprocess.Popen(
            invoke_argv("fetch-model"),
            env=cli_env(hub, project),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    root = Path(spec.model.local_dir)
    for path, data in files.items():
        assert (root / path).read_bytes() == data
    # One process downloaded each file once; the other waited, then found everything verified.
    for path in files:
        assert hub.count(f"/resolve/{sha}/{path}") == 1, path
    waited = [o for o, _e in outs if "waiting for another fetch" in o]
    assert len(waited) == 1
    assert "0 downloaded" in waited[0] and f"{len(files)} verified earlier" in waited[0]
    assert lockmod.read(project.lock_path).models["t"].commit == sha


def test_user_errors_exit_1_with_a_message_and_no_traceback(hub, make_project, golden):
    hub.repo("acme/gated-cli", gated=True).add_commit(tiny_files("g", shards=1, shard_size=1024))
    hub.repo("acme/ok-cli").add_commit(tiny_files("ok", shards=1, shard_size=1024))
    cases = [
        ("gated", {"repo": "acme/gated-cli"}, {"HF_TOKEN": "hf_v3ry_s3cret_token"}, []),
        ("missing", {"repo": "acme/absent"}, {}, []),
        ("bad-revision", {"repo": "acme/ok-cli", "revision": "nope"}, {}, []),
        ("system-dest", {"repo": "acme/ok-cli"}, {}, ["--dest", "/proc/rigsmith-cannot-write-here"]),
        ("unwritable-dest", {"repo": "acme/ok-cli"}, {}, ["--dest", "ROOT/a-file/models"]),
    ]
    out = []
    for name, model, env, extra in cases:
        project, _ = make_project(name=name, **model)
        (project.root / "a-file").write_text("in the way\n")
        extra = [a.replace("ROOT", str(project.root)) for a in extra]
        res = run_cli(hub, project, "fetch-model", "--deployment", name, *extra, **env)
        assert res.returncode == 1, res
        assert "Traceback" not in res.stderr + res.stdout
        assert "hf_v3ry_s3cret_token" not in res.stderr + res.stdout
        out.append(
            f"== {name}\n" + res.stderr.replace(hub.url, "http://HUB").replace(str(project.root), "ROOT")
        )
    golden("cli-errors.txt", "".join(out))


def test_invoke_pin_locks_the_model_branch_then_keeps_it(hub, make_project):
    repo = hub.repo("acme/pinned-by-cli")
    first = repo.add_commit(tiny_files("acme/pinned-by-cli", shards=1))
    project, _spec = make_project(repo="acme/pinned-by-cli", revision="main")
    done = run_cli(hub, project, "pin")
    assert done.returncode == 0, done.stderr
    locked = lockmod.read(project.lock_path).models["t"]
    assert (locked.requested, locked.commit) == ("main", first)
    second = repo.add_commit({"README.md": b"moved on\n"})
    again = run_cli(hub, project, "pin")
    assert again.returncode == 0, again.stderr
    assert lockmod.read(project.lock_path).models["t"].commit == first, "a pin only moves when asked"
    moved = run_cli(hub, project, "pin", "--repin", "--yes")
    assert moved.returncode == 0, moved.stderr
    assert lockmod.read(project.lock_path).models["t"].commit == second
    assert "README.md" in moved.stdout
