"""The one writer: statuses, consent, --check, atomic all-or-nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith import writer
from rigsmith.errors import ConsentError, DriftError, RigsmithError
from rigsmith.writer import Artifact

GEN = f"# {writer.BANNER_MARK}\nbody\n"


def _quiet(_m: str) -> None:
    pass


def test_create_then_identical(tmp_path: Path) -> None:
    a = [Artifact(tmp_path / "d/run.sh", GEN, 0o755)]
    assert [o.status for o in writer.write(a, echo=_quiet)] == ["create"]
    assert (tmp_path / "d/run.sh").stat().st_mode & 0o777 == 0o755
    assert [o.status for o in writer.write(a, echo=_quiet)] == ["identical"]


def test_update_without_consent_writes_nothing_and_shows_diff(tmp_path: Path) -> None:
    p1, p2 = tmp_path / "a", tmp_path / "b"
    p1.write_text(GEN)
    lines: list[str] = []
    with pytest.raises(ConsentError, match="nothing was written") as err:
        writer.write([Artifact(p1, GEN + "more\n"), Artifact(p2, GEN)], echo=lines.append, root=tmp_path)
    assert "--yes" in str(err.value)
    assert p1.read_text() == GEN and not p2.exists(), "a refused write must not half-write"
    assert any("+more" in ln and "--- a/a" in ln for ln in lines)


def test_user_file_without_banner_is_a_conflict(tmp_path: Path) -> None:
    p = tmp_path / "100.conf"
    p.write_text("arch: amd64\n")
    (o,) = writer.plan([Artifact(p, GEN)])
    assert o.status == "conflict"


def test_consent_by_prompt_or_yes(tmp_path: Path) -> None:
    p = tmp_path / "a"
    p.write_text(GEN)
    asked: list[str] = []
    with pytest.raises(ConsentError, match="not changed"):
        writer.write([Artifact(p, GEN + "x\n")], confirm=lambda q: asked.append(q) or False, echo=_quiet)
    assert asked and p.read_text() == GEN
    writer.write([Artifact(p, GEN + "x\n")], confirm=lambda q: True, echo=_quiet)
    assert p.read_text() == GEN + "x\n"
    writer.write([Artifact(p, GEN + "y\n")], yes=True, echo=_quiet)
    assert p.read_text() == GEN + "y\n"


def test_check_reports_drift_and_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "a"
    p.write_text(GEN)
    writer.write([Artifact(p, GEN)], check=True, echo=_quiet)
    with pytest.raises(DriftError, match="1 generated file"):
        writer.write([Artifact(p, GEN + "z\n")], check=True, echo=_quiet)
    with pytest.raises(DriftError):
        writer.write([Artifact(tmp_path / "new", GEN)], check=True, echo=_quiet)
    assert p.read_text() == GEN and not (tmp_path / "new").exists()


def test_a_path_in_the_way_is_an_error_naming_it_and_nothing_is_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    (tmp_path / "run.sh").mkdir()
    for bad in (blocker / "sub", tmp_path / "run.sh"):
        with pytest.raises(RigsmithError, match=f"cannot write {bad}: .*nothing was written"):
            writer.write([Artifact(tmp_path / "ok", GEN), Artifact(bad, GEN)], echo=_quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run.sh"]
    assert list((tmp_path / "run.sh").iterdir()) == []


def test_a_directory_that_cannot_be_created_is_an_error_and_leaves_no_temp_files(tmp_path: Path) -> None:
    ok = tmp_path / "a" / "ok"
    with pytest.raises(
        RigsmithError, match=r"cannot write /proc/rigsmith-nope/run.sh: .*nothing was written"
    ):
        writer.write([Artifact(ok, GEN), Artifact(Path("/proc/rigsmith-nope/run.sh"), GEN)], echo=_quiet)
    assert list((tmp_path / "a").iterdir()) == []


def test_a_failed_rename_names_what_was_replaced_and_removes_the_other_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path.replace
    calls: list[Path] = []

    def flaky(self: Path, target: Path) -> Path:  # the second rename fails, as on a full or read-only fs
        calls.append(Path(target))
        if len(calls) == 2:
            raise OSError(30, "Read-only file system")
        return real(self, target)

    monkeypatch.setattr(Path, "replace", flaky)
    files = [Artifact(tmp_path / n, GEN) for n in ("one", "two", "three")]
    with pytest.raises(
        RigsmithError, match=r"cannot replace .*/two: Read-only file system; already replaced: .*/one"
    ):
        writer.write(files, echo=_quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one"]
