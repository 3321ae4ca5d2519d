"""The one confinement rule (issue 23), checked as a property over hostile names and planted symlinks, and
through each surface that takes a name from outside: the Hub listing and lock file lists (fetch-model),
a checkpoint index (fit), tree and asset archives. Nothing resolves outside its root; every refusal is one
paragraph; reads and writes are recorded through audit hooks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import tarfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rigsmith import confine
from rigsmith.errors import RigsmithError
from rigsmith.resolving.fit import checkpoint
from rigsmith.resolving.fit.fit import FitError
from rigsmith.resolving.image.archive import unpack_tar
from rigsmith.resolving.model.modelfiles import remote_files
from tests.support import audit

PIECES = [
    "/", "//", "\\", ".", "..", "\0", "\x01", "\n", "\r", "\x7f", "\u200b", "\u2028", "a", "b.txt", " ",
    "\u2024", "\u2025", "\uff0f", "\uff0e", "\u2215", "\ufe52", "e\u0301", "\u202e", "~", "-", "%2e%2e",
]  # fmt: skip
NAMES = st.one_of(
    st.lists(st.sampled_from(PIECES), min_size=0, max_size=12).map("".join),
    st.integers(min_value=200, max_value=5000).map(lambda n: "d/" + "a" * n),
    st.text(max_size=40),
)
SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _stays_inside(name: str) -> None:
    """What an accepted name guarantees, checked independently of the rule's code."""
    assert not name.startswith("/") and "\\" not in name and "\0" not in name
    assert posixpath.normpath(name) == name and ".." not in name.split("/")
    folded = unicodedata.normalize("NFKC", name)
    assert ".." not in folded.split("/") and not folded.startswith("/")
    assert all(len(p.encode()) <= 255 for p in name.split("/"))
    root = "/r/o/o/t"
    assert posixpath.normpath(posixpath.join(root, name)).startswith(root + "/")


@SETTINGS
@given(name=NAMES)
@example("a/./b")
@example("a//b")
@example("a/")
@example("\uff0e\uff0e/x")
@example("x/\u2024\u2024/y")
def test_a_name_is_refused_in_one_paragraph_or_stays_inside(name: str) -> None:
    try:
        got = confine.check(name, "test")
    except confine.PathRefused as err:
        assert str(err).count("\n") == 1 and "hint:" in str(err)  # the message and its hint
        return
    _stays_inside(got)


@SETTINGS
@given(name=st.sampled_from(["a/b/c.txt", "a/c.txt", "x/y", "a/b"]), link=st.sampled_from(["a", "a/b", "x"]))
def test_no_path_through_a_planted_symlink(tmp_path: Path, name: str, link: str) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    if root.exists():
        for p in sorted(root.rglob("*"), reverse=True):
            p.unlink() if p.is_symlink() or p.is_file() else p.rmdir()
    root.mkdir(exist_ok=True)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside, target_is_directory=True)
    with audit.recording() as rec:
        try:
            path = confine.make_dirs(root, name, "test")
            path.write_bytes(b"x")
        except confine.PathRefused:
            pass
    assert list(outside.iterdir()) == []
    assert rec.writes_outside(root) == []


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(confine.PathRefused, match="not a regular file"):
        confine.open_regular(tmp_path, "fifo", "test")
    (tmp_path / "dir").mkdir()
    with pytest.raises(confine.PathRefused, match="not a regular file"):
        confine.open_regular(tmp_path, "dir", "test")
    with pytest.raises(confine.PathRefused, match="not a regular file"):
        confine.open_regular(Path("/dev"), "null", "test")


def test_open_file_refuses_a_link_and_names_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(confine.PathRefused) as err:
        confine.open_file(tmp_path / "link", "test")
    assert f"test: {tmp_path / 'link'} cannot be opened as a plain file (" in str(err.value)
    with pytest.raises(confine.PathRefused, match="does not exist"):
        confine.open_file(tmp_path / "gone", "test")
    with confine.open_file(tmp_path / "real", "test") as fh:
        assert fh.read() == b"x"


@SETTINGS
@given(name=NAMES)
def test_the_hub_listing_refuses_or_stays_inside(name: str) -> None:
    """fetch-model's file list (the Hub's tree listing and the lock's files go through the same check)."""
    try:
        files = remote_files([{"type": "file", "path": name, "size": 1, "oid": "0" * 40}], "hub")
    except RigsmithError as err:
        assert "Traceback" not in str(err)
        return
    for path in files:
        _stays_inside(path)


@SETTINGS
@given(name=NAMES)
def test_a_checkpoint_index_names_only_files_inside(tmp_path: Path, name: str) -> None:
    """fit's index: a name leaving the checkpoint is refused before any file is opened."""
    root = tmp_path / "ckpt"
    root.mkdir(exist_ok=True)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
    ckpt = checkpoint.LocalCheckpoint(root)
    with audit.recording() as rec:
        try:
            files = ckpt.weight_files()
        except FitError:
            files = []
        for f in files:
            _stays_inside(f)
            with contextlib.suppress(FitError):
                ckpt.header(f)
    real = str(root.resolve())
    assert all(p.startswith(real + "/") for _e, p in rec.reads if "ckpt" in p or p.startswith(str(tmp_path)))
    assert rec.writes == []


@SETTINGS
@given(names=st.lists(NAMES, min_size=1, max_size=3))
def test_an_archive_unpacks_only_names_inside_its_tree(names: list[str]) -> None:
    """The image-tree and asset unpacker: refused as a whole, or every member's name stays inside."""
    buf = io.BytesIO()
    try:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for n in names:
                info = tarfile.TarInfo(n)
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
    except (ValueError, UnicodeEncodeError):
        return  # tar itself cannot hold the name
    try:
        out = unpack_tar(buf.getvalue(), "asset 'x'", "vllm")
    except RigsmithError as err:
        assert "asset 'x'" in str(err)
        return
    for rel in out:
        _stays_inside(rel)


def _name_of(nbytes: int, unit: str) -> str:
    """A relative name of exactly ``nbytes`` UTF-8 bytes made of ``unit``, no part over 255 bytes."""
    size = len(unit.encode())
    full = unit * (254 // size)
    name = full
    while len(f"{name}/{full}".encode()) <= nbytes - 2:  # room left for "/" and a last part
        name = f"{name}/{full}"
    rest = nbytes - len(name.encode()) - 1  # 1..255
    name = f"{name}/{unit * (rest // size)}{'a' * (rest % size)}"
    assert len(name.encode()) == nbytes and all(len(p.encode()) <= confine.NAME_MAX for p in name.split("/"))
    return name


@pytest.mark.parametrize("unit", ["a", "é", "模"])  # 1, 2 and 3 UTF-8 bytes: the limits count bytes
def test_the_byte_limits_hold_at_their_exact_boundary(unit: str) -> None:
    part = unit * (confine.NAME_MAX // len(unit.encode()))
    part += "a" * (confine.NAME_MAX - len(part.encode()))
    assert len(part.encode()) == confine.NAME_MAX
    assert confine.why_unsafe(f"d/{part}") is None
    assert confine.why_unsafe(f"d/{part}a") == "a part of it is longer than 255 bytes"
    whole = _name_of(confine.PATH_MAX, unit)
    assert confine.why_unsafe(whole) is None
    assert confine.why_unsafe("a" + whole) == "it is longer than 4096 bytes"


@pytest.mark.parametrize(
    "char",
    [
        "\u200b",  # ZERO WIDTH SPACE (Cf)
        "\u200d",  # ZERO WIDTH JOINER (Cf)
        "\u202e",  # RIGHT-TO-LEFT OVERRIDE (Cf): shows "txt.exe" as "exe.txt"
        "\u2066",  # LEFT-TO-RIGHT ISOLATE (Cf)
        "\ufeff",  # ZERO WIDTH NO-BREAK SPACE / BOM (Cf)
        "\u2028",  # LINE SEPARATOR (Zl)
        "\u2029",  # PARAGRAPH SEPARATOR (Zp)
        "\x85",  # NEXT LINE (Cc)
        "\x1b",  # ESCAPE (Cc): a terminal sequence
    ],
)
@pytest.mark.parametrize("where", ["{c}x/y", "x/{c}y", "x/y{c}", "x{c}/y"])
def test_a_unicode_format_or_line_character_anywhere_in_a_name_is_refused(char: str, where: str) -> None:
    """Invisible or reordering characters make a name read as another one; every one is refused, named."""
    name = where.format(c=char)
    assert confine.why_unsafe(name) == "it contains a control character or line break"
    with pytest.raises(confine.PathRefused) as err:
        confine.check(name, "bundle member")
    assert str(err.value).startswith(f"bundle member: {name!r} is not a path inside its directory")


@pytest.mark.parametrize("name", [None, 5, b"a.txt", ["a"], ""])
def test_a_name_that_is_not_text_is_refused_naming_the_field(name: object) -> None:
    """A JSON listing or index can hold a number, null or a list where a file name belongs."""
    assert confine.why_unsafe(name) == "it is empty or not text"
    with pytest.raises(confine.PathRefused) as err:
        confine.check(name, "lock files[3].name")
    assert str(err.value).startswith(f"lock files[3].name: {name!r} is not a path inside its directory")


@pytest.mark.parametrize("name", ["a//b", "a/", "a/b//", "x"])
def test_an_empty_part_is_refused_as_such_and_a_one_letter_name_is_a_name(name: str) -> None:
    if name == "x":
        assert confine.why_unsafe(name) is None
    else:
        assert confine.why_unsafe(name) == "it has an empty part (// or a trailing /)"


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "x",
        "a/b/c.json",
        "e\u0301t\u00e9/caf\u00e9.txt",  # a combining accent: NFKC composes it, nothing folds into '/' or '.'
        "\ufb01le/x\u00b2.bin",  # the ligature "fi" and a superscript two: NFKC spells them out
        "\u6a21\u578b/\u6743\u91cd.bin",
    ],
)
def test_a_plain_name_and_one_that_nfkc_changes_harmlessly_are_accepted(name: str, tmp_path: Path) -> None:
    assert confine.check(name, "test") == name
    path = confine.make_dirs(tmp_path, name, "test")
    path.write_bytes(b"ok")
    assert confine.read_regular(tmp_path, name, "test") == b"ok"


def test_a_file_where_a_directory_should_be_is_refused_naming_the_name(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a file")
    for call in (confine.under, confine.open_regular):
        with pytest.raises(confine.PathRefused) as err:
            call(tmp_path, "a/b.txt", "bundle member")
        assert "bundle member: 'a/b.txt'" in str(err.value) and "Traceback" not in str(err.value)
    with pytest.raises(confine.PathRefused) as err:
        confine.make_dirs(tmp_path, "a/b/c.txt", "bundle member")
    assert "is a link or a file, not a directory" in str(err.value)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a\0b", "it contains a NUL byte"),
        ("a\\b", "it contains a backslash"),
        ("/etc/passwd", "it is absolute"),
        ("a/../b", "it has a '..' part"),
        ("./a", "it has a '.' part"),
        ("a\x07b", "it contains a control character or line break"),
        ("a\uff3cb", "it holds characters that fold into '/', '\\' or '.' (Unicode look-alikes)"),  # ＼
        ("a\ufe68b", "it holds characters that fold into '/', '\\' or '.' (Unicode look-alikes)"),  # ﹨
        ("\uff0fetc", "it holds characters that fold into '/', '\\' or '.' (Unicode look-alikes)"),  # ／
        ("a/\u2024", "it holds characters that fold into '/', '\\' or '.' (Unicode look-alikes)"),  # ․
    ],
)
def test_each_refusal_says_what_is_wrong_with_the_name(name: str, why: str) -> None:
    assert confine.why_unsafe(name) == why
    with pytest.raises(confine.PathRefused) as err:
        confine.check(name, "bundle member")
    assert f"({why}); refused, nothing was written" in str(err.value)
