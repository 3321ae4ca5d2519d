"""image.yaml validation, the rendered build context (golden), and the refusals a user meets first."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from rigsmith.errors import LockError, RigsmithError, SpecError
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import image as imagemod
from rigsmith.resolving.image import imagedef
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import GOLDEN, REPO, compare_tree
from tests.support.images import tiny_image

BASE = "127.0.0.1:5000/tinybase:1"
BASE_DIGEST = "sha256:" + "a" * 64
#: Matches the lock of make_seed_project (tests/support/common.py).
VLLM_BASE_DIGEST = "sha256:" + "2" * 64


def _lock(ref: str, digest: str) -> lockmod.Lock:
    return lockmod.Lock(images={ref: lockmod.LockedImage(digest=digest)})


def _context(root: Path, name: str, lock: lockmod.Lock) -> imagemod.Context:
    d = imagedef.load(root / "images", name)
    return imagemod.render_context(
        imagemod.gather(root / "images", name, d), lock, command=buildmod.build_command(name)
    )


def _texts(ctx: imagemod.Context) -> dict[str, str]:
    return {rel: f.data.decode() for rel, f in ctx.files.items()}


def _seed_copy(tmp_path: Path) -> Path:
    """The shipped images/vllm-3x3090 with stand-in patch files in its three slots."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "images" / "vllm-3x3090", root / "images" / "vllm-3x3090")
    for slot in ("vllm-patch", "ple-host-gather", "model-state-hook"):
        (root / "images" / "vllm-3x3090" / "patches" / f"{slot}.patch").write_text(f"stand-in for {slot}\n")
    return root


def test_tiny_context_matches_golden(tmp_path: Path, update_golden: bool) -> None:
    tiny_image(tmp_path, BASE)
    ctx = _context(tmp_path, "tiny", _lock(BASE, BASE_DIGEST))
    compare_tree(_texts(ctx), GOLDEN / "images" / "tiny", update_golden)
    assert {rel: f.mode for rel, f in ctx.files.items()} == {
        "Dockerfile": 0o644,
        "files/greet.txt": 0o644,
        "rigsmith/apply-patch.sh": 0o755,
        "rigsmith/patches/greet.patch": 0o644,
    }
    assert ctx.base == f"127.0.0.1:5000/tinybase@{BASE_DIGEST}"
    assert ctx.dockerfile.count("\nFROM ") == 1 and f"\nFROM {ctx.base}\n" in ctx.dockerfile


def test_seed_000_dockerfile_matches_golden(tmp_path: Path, update_golden: bool) -> None:
    root = _seed_copy(tmp_path)
    ctx = _context(root, "vllm-3x3090", _lock("vllm/vllm-openai:nightly", VLLM_BASE_DIGEST))
    compare_tree(_texts(ctx), GOLDEN / "images" / "vllm-3x3090", update_golden)
    # Hub short names are written fully qualified, so Podman never has to guess a registry.
    assert ctx.base == f"docker.io/vllm/vllm-openai@{VLLM_BASE_DIGEST}"
    assert set(ctx.patch_hashes) == {
        "images/vllm-3x3090/patches/vllm-patch.patch",
        "images/vllm-3x3090/patches/ple-host-gather.patch",
        "images/vllm-3x3090/patches/model-state-hook.patch",
    }
    for slot in ("vllm-patch", "ple-host-gather", "model-state-hook"):
        assert ctx.labels[f"io.rigsmith.patch.{slot}.sha256"] == imagemod.sha256(
            f"stand-in for {slot}\n".encode()
        )


def test_render_is_deterministic_and_the_inputs_hash_follows_every_input(tmp_path: Path) -> None:
    tiny_image(tmp_path, BASE)
    lock = _lock(BASE, BASE_DIGEST)
    a, b = _context(tmp_path, "tiny", lock), _context(tmp_path, "tiny", lock)
    assert imagemod.context_tar(a.files, 0) == imagemod.context_tar(b.files, 0)
    assert a.inputs_sha256 == b.inputs_sha256
    (tmp_path / "images" / "tiny" / "patches" / "greet.patch").write_text("--- other\n")
    c = _context(tmp_path, "tiny", lock)
    assert c.inputs_sha256 != a.inputs_sha256
    assert c.labels["io.rigsmith.patch.greet.sha256"] != a.labels["io.rigsmith.patch.greet.sha256"]
    d = _context(tmp_path, "tiny", _lock(BASE, "sha256:" + "b" * 64))
    assert d.inputs_sha256 not in (a.inputs_sha256, c.inputs_sha256)


def test_context_tar_has_fixed_metadata() -> None:
    files = {"b/x": imagemod.ContextFile(b"x", 0o755), "a": imagemod.ContextFile(b"", 0o600)}
    with tarfile.open(fileobj=io.BytesIO(imagemod.context_tar(files, 1234))) as tar:
        members = [(m.name, m.mode, m.mtime, m.uid, m.gid, m.uname, m.isdir()) for m in tar.getmembers()]
    assert members == [
        ("a", 0o600, 1234, 0, 0, "", False),
        ("b", 0o755, 1234, 0, 0, "", True),
        ("b/x", 0o755, 1234, 0, 0, "", False),
    ]


def test_tag_only_base_is_refused_with_the_pin_hint(tmp_path: Path, update_golden: bool) -> None:
    tiny_image(tmp_path, BASE)
    with pytest.raises(LockError) as err:
        _context(tmp_path, "tiny", lockmod.Lock())
    compare_tree(
        {"tag-only-base.txt": str(err.value) + "\n"}, GOLDEN / "images" / "errors-tag-only", update_golden
    )
    assert "run `invoke pin`" in str(err.value)


def test_shipped_seed_definition_names_its_missing_patch_slots(update_golden: bool) -> None:
    d = imagedef.load(REPO / "images", "vllm-3x3090")
    assert d.base.tag_ref == "vllm/vllm-openai:nightly" and d.base.digest is None
    assert [p.slot for p in d.patches] == ["vllm-patch", "ple-host-gather", "model-state-hook"]
    with pytest.raises(SpecError) as err:
        imagemod.gather(REPO / "images", "vllm-3x3090", d)
    assert [path for path, _ in err.value.problems] == ["patches[0]", "patches[1]", "patches[2]"]
    compare_tree(
        {"missing-patches.txt": str(err.value) + "\n"},
        GOLDEN / "images" / "errors-missing-patches",
        update_golden,
    )


def test_invalid_definition_reports_every_problem(tmp_path: Path, update_golden: bool) -> None:
    home = tmp_path / "images" / "bad"
    home.mkdir(parents=True)
    (home / "image.yaml").write_text(
        yaml.safe_dump(
            {
                "base": {"name": "vllm/vllm-openai:latest"},
                "pip": ["requests", "numpy>=1"],
                "patches": [
                    {"slot": "a", "file": "../a.patch"},
                    {"slot": "b", "file": "b.patch", "target": "path"},
                ],
                "labels": {"org.opencontainers.image.source": "x"},
                "build_args": {"SOURCE_DATE_EPOCH": "1"},
                "colour": "blue",
            }
        )
    )
    with pytest.raises(SpecError) as err:
        imagedef.load(tmp_path / "images", "bad")
    golden = GOLDEN / "images" / "errors-invalid"
    compare_tree({"invalid.txt": str(err.value) + "\n"}, golden, update_golden)
    paths = [p for p, _ in err.value.problems]
    for field in ("base", "pip", "patches[0].file", "patches[1]", "labels", "build_args", "colour"):
        assert field in paths, field


def test_unknown_image_and_deployment_without_build_are_clear(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    with pytest.raises(SpecError, match="does not exist; known images: none"):
        imagedef.load(tmp_path / "images", "nope")
    project = Project(tmp_path)
    (tmp_path / "deployments").mkdir()
    shutil.copy(REPO / "deployments" / "flash-next-merlin-4x3090.yaml", tmp_path / "deployments")
    with pytest.raises(RigsmithError, match="does not build an image"):
        buildmod.image_name(project, image=None, deployment=None)


def test_template_override_replaces_a_block(tmp_path: Path) -> None:
    home = tiny_image(tmp_path, BASE, template="custom.Dockerfile.j2")
    (home / "custom.Dockerfile.j2").write_text(
        '{% extends "Dockerfile.j2" %}\n{% block smoke %}\nRUN ["/bin/true"]\n{% endblock %}\n'
    )
    ctx = _context(tmp_path, "tiny", _lock(BASE, BASE_DIGEST))
    assert 'RUN ["/bin/true"]\n' in ctx.dockerfile
    assert "smoke: ok" not in ctx.dockerfile
    assert ctx.dockerfile.startswith("# Generated by rigsmith")


def test_materialize_replaces_the_context_dir_exactly(tmp_path: Path) -> None:
    tiny_image(tmp_path, BASE)
    ctx = _context(tmp_path, "tiny", _lock(BASE, BASE_DIGEST))
    dest = tmp_path / "build" / "images" / "tiny"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("left over")
    buildmod.materialize(ctx, dest, 0)
    found = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert found == set(ctx.files)
    assert (dest / "rigsmith" / "apply-patch.sh").stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mtime for p in dest.rglob("*")} == {0}
    assert [p.name for p in dest.parent.iterdir()] == ["tiny"]


def test_build_names_every_blocker_at_once(tmp_path: Path) -> None:
    tiny_image(tmp_path, BASE)
    (tmp_path / "images" / "tiny" / "patches" / "greet.patch").unlink()
    with pytest.raises(SpecError) as err:
        buildmod.prepare(Project(tmp_path), "tiny")
    assert [path for path, _ in err.value.problems] == ["patches[0]", "base"]
    assert "run `invoke pin`" in str(err.value)


def test_committed_image_schema_is_current() -> None:
    import json

    committed = json.loads((REPO / "schema" / "image.schema.json").read_text())
    assert committed == imagedef.schema(), "regenerate: invoke schema"


class _NoRegistry:
    """A resolver that must not be asked."""

    def resolve(self, ref: str) -> object:
        raise AssertionError(f"resolve({ref!r}) was called")


def test_pin_skips_local_only_names_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    shutil.copy(REPO / "deployments" / "flash-next-merlin-4x3090.yaml", tmp_path / "deployments")
    lines: list[str] = []
    project = Project(tmp_path)
    assert buildmod.floating_image_refs(project) == [
        ("localhost/vllm-merlin:v2.5.1", "deployments/flash-next-merlin-4x3090.yaml engine.image")
    ]
    assert buildmod.pin_images(project, _NoRegistry(), echo=lines.append) == []  # type: ignore[arg-type]
    assert "skip  localhost/vllm-merlin:v2.5.1" in lines[0] and "local-only" in lines[0]
    assert not project.lock_path.exists()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"source": "https://x.invalid\nRUN touch /tmp/rigsmith-pwned-d"}, "source"),
        ({"revision": "r1\nRUN id"}, "revision"),
        ({"labels": {"org.example.note\n": "x"}}, "labels"),
        ({"build_args": {"GREETING\n": "x"}}, "build_args"),
        ({"pip": ["requests==2.0\n"]}, "pip"),
    ],
    ids=["source", "revision", "label-key", "arg-name", "pip"],
)
def test_a_newline_that_would_start_a_dockerfile_instruction_is_refused(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    tiny_image(tmp_path, BASE, **changes)
    with pytest.raises(SpecError) as err:
        imagedef.load(tmp_path / "images", "tiny")
    assert field in [p for p, _ in err.value.problems], str(err.value)


@pytest.mark.parametrize("brk", list("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"), ids=lambda c: f"U+{ord(c):04X}")
def test_a_line_break_of_any_class_in_a_dockerfile_value_is_refused(tmp_path: Path, brk: str) -> None:
    """LABEL/ARG values are one Dockerfile line each: every str.splitlines break is refused (issue 10 #6)."""
    home = tmp_path / "images" / "brk"
    home.mkdir(parents=True)
    (home / "image.yaml").write_text(  # JSON is YAML, and escapes the break (PyYAML would fold a NEL)
        json.dumps(
            {
                "base": {"name": "vllm/vllm-openai", "digest": "sha256:" + "2" * 64},
                "labels": {"x.note": f"a{brk}RUN touch /pwned"},
                "build_args": {"PIP_INDEX_URL": f"http://127.0.0.1/{brk}RUN id"},
                "source": f"https://example.invalid/{brk}x",
            }
        )
    )
    with pytest.raises(SpecError) as err:
        imagedef.load(tmp_path / "images", "brk")
    paths = " ".join(p for p, _ in err.value.problems)
    for field in ("labels", "build_args", "source"):
        assert field in paths, (field, str(err.value))
