"""Untrusted archives and URLs of source trees: what unpack_tar, merge_tree and the tree model refuse."""

from __future__ import annotations

import io
import tarfile

import pytest
from pydantic import ValidationError

from rigsmith.resolving.image import image as imagemod
from rigsmith.resolving.image import imagedef
from rigsmith.resolving.image.archive import ArchiveError, merge_tree, unpack_tar
from rigsmith.resolving.image.image import ContextFile


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """(name, kind, data-or-link) with kind file | sym | hard | fifo | dir."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            types = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}
            info.type = types.get(kind, tarfile.DIRTYPE)
            if kind in ("sym", "hard"):
                assert isinstance(payload, str)
                info.linkname = payload
            tar.addfile(info)
    return buf.getvalue()


def test_files_links_inside_and_exec_bits_come_through_under_the_unpack_dir() -> None:
    data = _tar(
        ("./a/", "dir", ""), ("./a/x.py", "file", b"x"), ("a/l", "sym", "x.py"), ("a/h", "hard", "a/x.py")
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        assert t.getmember("./a/x.py").mode == 0o644
    out = unpack_tar(data, "asset 'ops'", "vllm")
    assert out == {
        "vllm/a/x.py": ContextFile(b"x"),
        "vllm/a/l": ContextFile(b"", 0o777, "x.py"),
        "vllm/a/h": ContextFile(b"x"),
    }


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ((("/etc/passwd", "file", b"x"),), "'/etc/passwd' is not a path inside its directory"),
        ((("a/../../x", "file", b"x"),), "(it has a '..' part)"),
        ((("l", "sym", "/etc"),), "link 'l' -> '/etc' points outside the tree"),
        ((("a/l", "sym", "../../etc"),), "points outside the tree"),
        ((("l", "sym", "a"), ("l/x", "file", b"x")), "lies below a symlink"),
        ((("p", "fifo", b""),), "is not a file, directory or link"),
        ((("x", "file", b"1"), ("x", "file", b"2")), "appears twice"),
        ((("h", "hard", "nothing"),), "hard link 'h' to a file not before it"),
    ],
)
def test_an_unsafe_member_refuses_the_whole_archive(
    members: tuple[tuple[str, str, bytes | str], ...], words: str
) -> None:
    with pytest.raises(ArchiveError) as err:
        unpack_tar(_tar(*members), "asset 'ops'")
    assert words in str(err.value) and "asset 'ops'" in str(err.value)


def test_an_archive_unpacking_past_the_limit_is_refused() -> None:
    data = _tar(("a", "file", b"x" * 600), ("b", "file", b"y" * 600))
    with pytest.raises(ArchiveError, match="asset 'ops': its members declare 1200 bytes unpacked, more than"):
        unpack_tar(data, "asset 'ops'", max_bytes=1000)


def test_garbage_is_not_a_tar_and_says_so() -> None:
    with pytest.raises(ArchiveError, match="asset 'ops': not a readable tar archive"):
        unpack_tar(b"<html>404</html>", "asset 'ops'")


def test_an_asset_never_replaces_a_file_of_the_commit_nor_writes_below_its_symlink() -> None:
    tree = {"scales/k.json": ContextFile(b"{}"), "latest": ContextFile(b"", 0o777, "scales")}
    with pytest.raises(ArchiveError, match="asset 'ops' would replace 1 file"):
        merge_tree(tree, {"ops": {"scales/k.json": ContextFile(b"evil")}})
    with pytest.raises(ArchiveError, match="'latest/x' lies below a symlink"):
        merge_tree(tree, {"ops": {"latest/x": ContextFile(b"evil")}})


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://example.com/ops.tar.gz", "plain http only to a loopback host"),
        ("https://user:tok@example.com/x", "no credentials"),
        ("ftp://example.com/x", "must be https://"),
        ("https://example.com/a b", "no spaces"),
    ],
)
def test_asset_urls_are_https_or_loopback_http_without_credentials(url: str, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        imagedef.Asset(name="ops", url=url, unpack=".")


@pytest.mark.parametrize(
    "repo", ["ext::sh -c touch% /tmp/pwned", "-uhttps://x", "https://x/a b", "/srv/repo"]
)
def test_git_urls_other_than_the_known_schemes_are_refused(repo: str) -> None:
    with pytest.raises(ValidationError, match="a git URL must start with"):
        imagedef.Tree(repo=repo, ref="main", dest="/opt/x")


def test_a_tree_dest_that_would_not_stay_one_raw_workdir_word_is_refused() -> None:
    with pytest.raises(ValidationError, match="written raw as WORKDIR"):
        imagedef.Tree(repo="https://x/y", ref="main", dest="/opt/a b")


@pytest.mark.parametrize("ref", ["--upload-pack=x", "a..b", "main.lock", "a b"])
def test_refs_that_are_not_git_refs_are_refused(ref: str) -> None:
    with pytest.raises(ValidationError, match="is not a branch, tag or commit sha"):
        imagedef.Tree(repo="https://x/y", ref=ref, dest="/opt/x")


def test_pip_install_of_the_tree_renders_after_the_copy() -> None:
    from rigsmith.resolving.lock import lock as lockmod

    d = imagedef.ImageDef.model_validate(
        {
            "base": {"name": "b", "digest": "sha256:" + "a" * 64},
            "tree": {"repo": "https://x/y", "ref": "v1", "dest": "/opt/y/", "install": "pip"},
        }
    )
    lock = lockmod.Lock(sources={"y": lockmod.LockedSource(repo="https://x/y", ref="v1", commit="c" * 40)})
    inputs = imagemod.Inputs("y", d, {}, {}, None, {"setup.py": ContextFile(b"")})
    text = imagemod.render_context(inputs, lock, command="t").dockerfile
    assert (
        'COPY ["tree/", "/opt/y/"]\n'
        'RUN ["python3", "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--no-build-isolation", '
        '"/opt/y"]\n'
    ) in text
    assert "ENV PYTHONPATH" not in text


def test_source_image_context_matches_golden(update_golden: bool) -> None:
    """The Dockerfile of a source image and its context's file list (the tree under tree/)."""
    from rigsmith.resolving.lock import lock as lockmod
    from tests.support.common import GOLDEN, compare_tree

    d = imagedef.ImageDef.model_validate(
        {
            "base": {"name": "127.0.0.1:5000/tinybase", "tag": "1"},
            "tree": {
                "repo": "git://127.0.0.1:9418/merlin",
                "ref": "v2.5.1",
                "dest": "/opt/merlin",
                "pythonpath": "vllm-v2.5",
                "assets": [{"name": "compiled-ops", "url": "https://example.com/ops.tar.gz", "unpack": "."}],
            },
            "smoke": ["/bin/sh", "-c", "test -s /opt/merlin/scales/k.json"],
        }
    )
    lock = lockmod.Lock(
        images={"127.0.0.1:5000/tinybase:1": lockmod.LockedImage(digest="sha256:" + "a" * 64)},
        sources={
            "merlin": lockmod.LockedSource(
                repo="git://127.0.0.1:9418/merlin",
                ref="v2.5.1",
                commit="c" * 40,
                assets={
                    "compiled-ops": lockmod.LockedAsset(
                        url="https://example.com/ops.tar.gz", sha256="sha256:" + "b" * 64, size=3
                    )
                },
            )
        },
    )
    tree = {
        "scales/k.json": ContextFile(b"{}\n"),
        "scripts/serve.sh": ContextFile(b"#!/bin/sh\n", 0o755),
        "latest": ContextFile(b"", 0o777, "scales"),
        "vllm-v2.5/vllm/_C.abi3.so": ContextFile(b"ops"),
    }
    ctx = imagemod.render_context(
        imagemod.Inputs("merlin", d, {}, {}, None, tree), lock, command="invoke build"
    )
    listing = "".join(
        f"{rel} {f.mode:o}{' -> ' + f.link if f.link else ''}\n" for rel, f in ctx.files.items()
    )
    compare_tree(
        {"Dockerfile": ctx.dockerfile, "context.txt": listing},
        GOLDEN / "images" / "source-tree",
        update_golden,
    )


def test_an_archive_declaring_more_than_the_budget_is_refused_before_unpacking() -> None:
    """A compression bomb: sizes are summed from the headers before any member's bytes are kept."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"zeros-{i}")
            info.size = 8 << 20
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    data = buf.getvalue()
    assert len(data) < 200_000
    with pytest.raises(ArchiveError, match=r"declare 25165824 bytes unpacked, more than the 16777216 bytes"):
        unpack_tar(data, "asset 'bomb'", max_bytes=16 << 20)
    assert len(unpack_tar(data, "asset 'bomb'", max_bytes=32 << 20)) == 3
