"""rigsmith.lock's history: every change kept with its command, `invoke lock --history / --diff`, and
`pin --repin` showing the diff and asking before it writes (the Hub stand-in moves a branch)."""

from __future__ import annotations

import json

import pytest

from rigsmith.errors import ConsentError, LockError
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockdiff, lockhistory, repin
from tests.support.models import run_cli, tiny_files


def _model(commit: str, files: dict[str, int], patched: str | None = None) -> lockmod.LockedModel:
    return lockmod.LockedModel(
        repo="acme/m",
        commit=commit,
        files={p: lockmod.LockedFile(size=n, sha256=f"{n:064x}") for p, n in files.items()},
        patches=[lockmod.LockedPatch(file="config.json", original_sha256="a" * 64, patched_sha256=patched)]
        if patched
        else [],
    )


def test_every_change_is_kept_with_its_command_and_the_lock_before_the_first(tmp_path):
    path = tmp_path / "rigsmith.lock"
    path.write_text(lockmod.dumps(lockmod.Lock(models={"t": _model("1" * 40, {"a.bin": 10})})))
    with lockhistory.because("invoke pin --repin", "testing"), lockmod.locked(path) as lock:
        lock.models["t"] = _model("2" * 40, {"a.bin": 10})
    with lockmod.locked(path):
        pass  # no change: no entry
    have = lockhistory.entries(path)
    assert [(e.n, e.command, e.reason) for e in have] == [
        (1, "(before history)", None),
        (2, "invoke pin --repin", "testing"),
    ]
    assert (tmp_path / ".rigsmith/locks/0002.lock").read_text() == path.read_text()
    assert lockhistory.current_number(path) == 2
    # A hand edit between two rigsmith writes is kept too, so each diff stays honest.
    path.write_text(lockmod.dumps(lockmod.Lock(models={"t": _model("3" * 40, {"a.bin": 10})})))
    assert lockhistory.current_number(path) is None
    with lockmod.locked(path) as lock:
        lock.models["t"] = _model("4" * 40, {"a.bin": 10})
    assert [e.command for e in lockhistory.entries(path)][2] == "(changed outside rigsmith)"
    lines = lockdiff.history_lines(path)
    assert lines[-1].startswith("*   4 ") and "model t 333333333333→444444444444" in lines[-1]


def test_a_staged_lock_keeps_no_history(tmp_path):
    staged = tmp_path / ".rigsmith/locks/staged.lock"
    with lockmod.locked(staged) as lock:
        lock.models["t"] = _model("1" * 40, {})
    assert lockhistory.entries(staged) == [] and not (staged.parent / ".rigsmith").exists()


def test_the_diff_names_commit_files_with_sizes_patches_images_builds_and_sources():
    old = lockmod.Lock(
        models={"t": _model("1" * 40, {"a.bin": 10, "gone.bin": 2048, "same.txt": 5}, patched="b" * 64)},
        secondary={"t": {"acme/draft": _model("5" * 40, {"d.bin": 1})}},
        images={"127.0.0.1:5000/x:1": lockmod.LockedImage(digest="sha256:" + "1" * 64)},
        builds={
            "tiny": lockmod.LockedBuild(
                ref="localhost/tiny", image_id="sha256:" + "a" * 64, base="b@sha256:" + "c" * 64
            )
        },
        sources={"tiny": lockmod.LockedSource(repo="https://git.example/x", ref="main", commit="6" * 40)},
    )
    new = lockmod.Lock(
        models={"t": _model("2" * 40, {"a.bin": 3 * 1024 * 1024, "new.bin": 1536, "same.txt": 5})},
        secondary={"t": {"acme/draft": _model("7" * 40, {"d.bin": 1})}},
        images={"127.0.0.1:5000/x:1": lockmod.LockedImage(digest="sha256:" + "2" * 64)},
        builds={
            "tiny": lockmod.LockedBuild(
                ref="localhost/tiny",
                image_id="sha256:" + "d" * 64,
                base="b@sha256:" + "e" * 64,
                patches={"patches/p.patch": "f" * 64},
            )
        },
        sources={"tiny": lockmod.LockedSource(repo="https://git.example/x", ref="main", commit="8" * 40)},
    )
    assert lockdiff.diff(old, new) == [
        "model t: commit 111111111111 → 222222222222 (acme/m)",
        "model t: ~ a.bin (10 B → 3.0 MiB)",
        "model t: - gone.bin (2.0 KiB)",
        "model t: + new.bin (1.5 KiB)",
        "model t: config patch of config.json removed",
        "secondary t acme/draft: commit 555555555555 → 777777777777 (acme/m)",
        "image 127.0.0.1:5000/x:1: digest sha256:111111111111 → sha256:222222222222",
        "build tiny: image_id sha256:aaaaaaaaaaaa → sha256:dddddddddddd",
        "build tiny: base b@sha256:cccccccccccc → b@sha256:eeeeeeeeeeee",
        "build tiny: patches patches/p.patch: (none) → ffffffffffff",
        "source tiny: commit 666666666666 → 888888888888",
    ]
    assert lockdiff.diff(new, new) == []


def test_an_unknown_entry_is_one_clear_error(tmp_path):
    path = tmp_path / "rigsmith.lock"
    with lockmod.locked(path) as lock:
        lock.models["t"] = _model("1" * 40, {})
    with pytest.raises(LockError, match=r"no entry 7 \(entries 1–1\)"):
        lockdiff.diff_lines(path, 7)


def test_repin_without_a_terminal_or_yes_changes_nothing(tmp_path):
    from rigsmith.project import Project

    project = Project(tmp_path)
    with lockmod.locked(project.lock_path) as lock:
        lock.models["t"] = _model("1" * 40, {"a.bin": 1})
    before = project.lock_path.read_bytes()
    staged = repin.stage(project)
    with lockmod.locked(staged.lock_path) as lock:
        lock.models["t"] = _model("2" * 40, {"a.bin": 1})
    said: list[str] = []
    with pytest.raises(ConsentError, match="no terminal"):
        repin.adopt(project, staged, yes=False, confirm=None, echo=said.append)
    assert project.lock_path.read_bytes() == before and not staged.lock_path.exists()
    assert "  model t: commit 111111111111 → 222222222222 (acme/m)" in said
    assert len(lockhistory.entries(project.lock_path)) == 1


def test_invoke_pin_repin_shows_the_diff_asks_and_history_records_both(hub, make_project):
    repo = hub.repo("acme/moving")
    files = tiny_files("acme/moving", shards=1)
    first = repo.add_commit(files)
    project, _spec = make_project(repo="acme/moving", revision="main")
    assert run_cli(hub, project, "pin").returncode == 0
    files2 = {**files, "README.md": b"# moved on, a longer readme\n", "extra.txt": b"new\n"}
    del files2["generation_config.json"]
    second = repo.add_commit(files2)

    refused = run_cli(hub, project, "pin", "--repin")
    assert refused.returncode == 1
    assert "no terminal to ask; nothing was written" in refused.stderr and "--yes" in refused.stderr
    assert f"model t: commit {first[:12]} → {second[:12]} (acme/moving)" in refused.stdout
    assert "model t: + extra.txt (4 B)" in refused.stdout
    assert "model t: - generation_config.json (20 B)" in refused.stdout
    assert lockmod.read(project.lock_path).models["t"].commit == first
    assert not (project.root / ".rigsmith/locks/staged.lock").exists()

    done = run_cli(hub, project, "pin", "--repin", "--yes")
    assert done.returncode == 0, done.stderr
    assert lockmod.read(project.lock_path).models["t"].commit == second

    hist = run_cli(hub, project, "lock", "--history")
    assert hist.returncode == 0, hist.stderr
    rows = hist.stdout.splitlines()
    assert len(rows) == 2 and rows[0].startswith("    1 ") and "invoke pin" in rows[0]
    assert rows[1].startswith("*   2 ") and "invoke pin --repin --yes" in rows[1]
    assert f"model t {first[:12]}→{second[:12]}" in rows[1]
    diff = run_cli(hub, project, "lock", "--diff", "1")
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.splitlines()[0] == "lock 1 → current:"
    assert f"  model t: ~ README.md ({len(files['README.md'])} B → 28 B)" in diff.stdout.splitlines()
    same = run_cli(hub, project, "lock", "--diff", "2 2")
    assert same.stdout.strip() == "lock 2 → 2: no change in the pinned facts"
    bad = run_cli(hub, project, "lock", "--diff", "x")
    assert bad.returncode == 1 and "not one or two lock numbers" in bad.stderr
    index = (project.root / ".rigsmith/locks/index.jsonl").read_text().splitlines()
    assert [json.loads(r)["n"] for r in index] == [1, 2]


def _pinned_twice(hub, make_project):
    """pin at commit A, then `pin --repin --yes` at B (config.json changed, a file added): the checkout."""
    repo = hub.repo("acme/twice")
    files = tiny_files("acme/twice", shards=1, shard_size=4096)
    first = repo.add_commit(files)
    project, _spec = make_project(repo="acme/twice", revision="main")
    assert run_cli(hub, project, "pin").returncode == 0
    config = json.loads(files["config.json"])
    config["max_position_embeddings"] = 4096
    files2 = {**files, "config.json": json.dumps(config).encode(), "added.bin": b"x" * 3000}
    second = repo.add_commit(files2)
    done = run_cli(hub, project, "pin", "--repin", "--yes")
    assert done.returncode == 0, done.stderr
    return project, first, second, len(files["config.json"]), len(files2["config.json"])


def test_pin_then_repin_is_two_entries_and_the_diff_names_changed_and_added_files_and_both_commits(
    hub, make_project
):
    project, first, second, size_a, size_b = _pinned_twice(hub, make_project)
    assert [e.command.split()[1] for e in lockhistory.entries(project.lock_path)] == ["pin", "pin"]
    diff = run_cli(hub, project, "lock", "--diff", "1 2")
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    assert lines[0] == "lock 1 → 2:"
    assert f"  model t: commit {first[:12]} → {second[:12]} (acme/twice)" in lines
    assert f"  model t: ~ config.json ({size_a} B → {size_b} B)" in lines
    assert "  model t: + added.bin (2.9 KiB)" in lines
    assert not any("added acme/twice" in ln for ln in lines)  # not "the whole model was added"


def _damaged(hub, project, args: tuple[str, ...]) -> str:
    out = run_cli(hub, project, *args)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    return " ".join(out.stderr.split())


@pytest.mark.parametrize("damage", ["missing", "fifo", "symlink", "truncated", "index-torn", "edited"])
def test_a_damaged_history_entry_is_one_error_naming_it_never_an_empty_lock(hub, make_project, damage):
    import os

    project, *_ = _pinned_twice(hub, make_project)
    hist = project.root / ".rigsmith/locks"
    entry = hist / "0001.lock"
    text = entry.read_text()
    if damage == "missing":
        entry.unlink()
    elif damage == "fifo":
        entry.unlink()
        os.mkfifo(entry)  # opened non-blocking: a reader that blocked would hang here
    elif damage == "symlink":
        outside = project.root / "elsewhere.lock"
        outside.write_text(text)
        entry.unlink()
        entry.symlink_to(outside)
    elif damage == "truncated":
        entry.write_text(text[: len(text) // 2])
    elif damage == "edited":
        entry.write_text(text.replace('"version"', '"version" ', 1))  # valid JSON, not the recorded text
    else:
        index = hist / "index.jsonl"
        rows = index.read_text().splitlines()
        index.write_text(rows[0] + "\n" + rows[1][: len(rows[1]) // 2] + "\n")
    for args in (("lock", "--history"), ("lock", "--diff", "1 2"), ("rollback", "--to", "1")):
        said = _damaged(hub, project, args)
        if damage == "index-torn":
            assert "index.jsonl line 2 is damaged" in said, said
        else:
            assert "lock history entry 1" in said and "0001.lock" in said, said
        assert "added" not in said
    assert lockmod.read(project.lock_path).models["t"].commit  # rigsmith.lock itself untouched
