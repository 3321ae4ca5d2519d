"""The engine image as an OCI archive: export with its digest preserved, load, and check what landed.

Which export keeps the digest the lock holds was measured on podman 4.3.1 + skopeo 1.9.3 (see
``bundle.py``'s module docstring): ``podman save --format oci-archive`` re-compresses the layers with the
same compressor ``podman push`` uses, so for an image built or imported here (and pushed from here) the
archive's manifest is byte for byte the pushed one; for an image compressed elsewhere (Docker Hub) it is
not, and ``skopeo copy --preserve-digests docker://NAME@DIGEST oci-archive:…`` from the registry is the
only faithful copy (skopeo refuses a copy out of containers-storage with ``--preserve-digests``: "would
require changing layer representation"). So: podman first, check, then skopeo from the registry, check.

podman is found on PATH (tests put an isolated-storage wrapper first), like ``invoke up``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigsmith.errors import AdapterError, CommandError, LockError, RigsmithError
from rigsmith.imageref import parse_ref
from rigsmith.resolving.lock import Lock
from rigsmith.resolving.registry import DOCKER_LIST, OCI_INDEX
from rigsmith.spec import Deployment

Run = Callable[[Sequence[str]], subprocess.CompletedProcess[bytes]]


class ImageMismatch(RigsmithError):
    """An image archive or a loaded image is not the one the lock pins."""


def run_command(argv: Sequence[str], timeout: float = 3600) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` capturing output; a missing binary reads as exit 127."""
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, b"", f"{argv[0]}: not found".encode())


@dataclass(frozen=True)
class ImagePin:
    """The image a deployment runs, as the lock pins it."""

    name: str  # repository as written, no tag or digest (what deploy puts before ``@sha256:…``)
    tag: str | None
    digest: str | None  # manifest digest the lock holds (registry digest)
    image_id: str | None  # config digest (a build that was not pushed is pinned by this alone)
    pinned_ref: str  # what the rendered artifacts run
    sources: tuple[str, ...]  # local names to export from, best first

    @property
    def local_tag_ref(self) -> str:
        """The name:tag an unbundled image is given, so ``name@digest`` resolves in local storage."""
        return f"{self.name}:{self.tag or 'bundled'}"


def image_pin(spec: Deployment, lock: Lock) -> ImagePin | None:
    """What ``deploy`` would run for ``spec``, from the lock; None for a venv engine (no image).

    Raises:
        LockError: the image is not pinned (bundling an unpinned tag would carry an unverifiable image).
    """
    if spec.engine.runtime == "venv":
        return None
    ref = spec.engine.image
    if ref:
        parsed = parse_ref(ref)
        name = ref.split("@", 1)[0]
        if parsed.tag and name.endswith(f":{parsed.tag}"):
            name = name[: -len(parsed.tag) - 1]
        digest = parsed.digest or (lock.images[ref].digest if ref in lock.images else None)
        locked = lock.images.get(ref)
        if locked is not None and locked.media_type in (OCI_INDEX, DOCKER_LIST) and not parsed.digest:
            # podman 4.3 cannot `load` an archive whose index holds an index (seen: "loading tar component
            # manifest.json: file does not exist"), so a multi-platform digest cannot travel as is.
            raise LockError(
                f"deployment {spec.name!r} runs {ref}, which the lock pins to a multi-platform index "
                f"({locked.digest}); a bundle carries one platform's image",
                hint=f"pin the platform's manifest: set engine.image to {name}@sha256:… (the linux/amd64 "
                f"entry of `skopeo inspect --raw docker://{name}@{locked.digest}`), then bundle again",
            )
        if digest is None:
            raise LockError(
                f"deployment {spec.name!r} runs {ref}, which rigsmith.lock does not pin by digest",
                hint="run `invoke pin` first (a local-only name: push it to a registry, or build it with "
                "engine.build), so the bundle carries exactly the pinned image",
            )
        tag = parsed.tag if parsed.tag and "@" not in ref else None
        sources = (f"{name}@{digest}", *([ref] if tag else []))
        return ImagePin(name, tag, digest, None, f"{name}@{digest}", sources)
    built = lock.builds.get(spec.engine.build) if spec.engine.build else None
    if built is not None:
        tag = (built.inputs_sha256 or "").removeprefix("sha256:")[:16] or None
        names = [f"{built.ref}@{built.digest}"] if built.digest else []
        if tag:
            names.append(f"{built.ref}:{tag}")
        names.append(built.image_id)
        return ImagePin(built.ref, tag, built.digest, built.image_id, built.pinned_ref, tuple(names))
    what = f"image build {spec.engine.build!r}, not in rigsmith.lock" if spec.engine.build else "no image"
    raise LockError(
        f"deployment {spec.name!r} runs {what}: there is no pinned image to bundle",
        hint=f"run `invoke build --image {spec.engine.build}` first"
        if spec.engine.build
        else "set engine.image (and `invoke pin`) or engine.build (and `invoke build`)",
    )


# -- reading an archive ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveFacts:
    """The image an OCI archive holds: its manifest digest and config digest (the image ID)."""

    manifest_digest: str
    config_digest: str


def archive_facts(path: Path, member: str = "image archive") -> ArchiveFacts:
    """Read index.json and the manifest of a one-image OCI archive; the manifest's hash is checked.

    Raises:
        ImageMismatch: not an OCI archive, or its manifest does not hash to what index.json names.
    """

    def bad(why: str) -> ImageMismatch:
        return ImageMismatch(
            f"{member}: {why}",
            hint="bundle again with `invoke bundle OUT` (the archive is damaged or not OCI)",
        )

    try:
        with tarfile.open(path, "r:") as tar:
            index = _json_member(tar, "index.json")
            manifests = index.get("manifests") or []
            if len(manifests) != 1:
                raise bad(f"index.json lists {len(manifests)} images, not one")
            digest = str(manifests[0].get("digest", ""))
            raw = _member_bytes(tar, "blobs/" + digest.replace(":", "/", 1))
    except (tarfile.TarError, OSError, ValueError) as err:
        raise bad(f"cannot read it as an OCI archive ({err})") from None
    actual = "sha256:" + hashlib.sha256(raw).hexdigest()
    if actual != digest:
        raise bad(f"the manifest hashes to {actual}, index.json says {digest}")
    config = json.loads(raw).get("config", {}).get("digest")
    if not isinstance(config, str):
        raise bad("the manifest names no config")
    return ArchiveFacts(digest, config)


def _member_bytes(tar: tarfile.TarFile, name: str) -> bytes:
    for candidate in (name, f"./{name}"):
        try:
            fh = tar.extractfile(candidate)
        except KeyError:
            continue
        if fh is not None:
            return fh.read()
    raise ValueError(f"no {name} in the archive")


def _json_member(tar: tarfile.TarFile, name: str) -> dict[str, Any]:
    data = json.loads(_member_bytes(tar, name))
    if not isinstance(data, dict):
        raise ValueError(f"{name} is not a JSON object")
    return data


def matches(pin: ImagePin, facts: ArchiveFacts) -> bool:
    """True when the archive is the pinned image (manifest digest when the lock has one, else the ID)."""
    if pin.digest is not None and facts.manifest_digest != pin.digest:
        return False
    return pin.image_id is None or facts.config_digest == pin.image_id


def _want(pin: ImagePin) -> str:
    return f"manifest {pin.digest}" if pin.digest else f"image ID {pin.image_id}"


# -- export ---------------------------------------------------------------------------------------------


def export(
    pin: ImagePin, dest: Path, *, run: Run = run_command, echo: Callable[[str], None] = print
) -> ArchiveFacts:
    """Write the pinned image to ``dest`` as an OCI archive whose digest is the lock's, or fail saying why.

    Tries ``podman save`` of each local name, then (for a registry digest) ``skopeo copy
    --preserve-digests`` from the registry. ``dest`` is replaced only by a matching archive.
    """
    tried: list[str] = []
    for src in pin.sources:
        if run(["podman", "image", "exists", src]).returncode != 0:
            tried.append(f"{src}: not in local storage")
            continue
        dest.unlink(missing_ok=True)
        _must(run, ["podman", "save", "--format", "oci-archive", "-o", str(dest), src])
        facts = archive_facts(dest)
        if matches(pin, facts):
            return facts
        tried.append(f"podman save {src}: manifest {facts.manifest_digest}, image ID {facts.config_digest}")
        break  # the same local image under another name saves the same bytes
    ref = parse_ref(pin.name + (f"@{pin.digest}" if pin.digest else ""))
    if pin.digest is not None and ref.registry != "localhost":
        echo(f"bundle: copying {pin.name}@{pin.digest} from its registry (skopeo, digests preserved)")
        dest.unlink(missing_ok=True)
        argv = ["skopeo", "copy", "--preserve-digests", "--quiet"]
        if ref.scheme == "http":
            argv.append("--src-tls-verify=false")
        argv += [f"docker://{pin.name}@{pin.digest}", f"oci-archive:{dest}:{pin.local_tag_ref}"]
        proc = run(argv)
        if proc.returncode == 0:
            facts = archive_facts(dest)
            if matches(pin, facts):
                return facts
            tried.append(f"skopeo copy: manifest {facts.manifest_digest}")
        else:
            tried.append(f"skopeo copy: exit {proc.returncode}: {_tail(proc.stderr)}")
    dest.unlink(missing_ok=True)
    raise ImageMismatch(
        f"cannot export {pin.pinned_ref} with the {_want(pin)} the lock holds; tried: " + "; ".join(tried),
        hint=f"pull it by digest (`podman pull {pin.pinned_ref}`) or make the registry reachable, then "
        "`invoke bundle OUT` again",
    )


# -- load -----------------------------------------------------------------------------------------------


def present(pin: ImagePin, run: Run = run_command) -> bool:
    """True when local storage already resolves the pinned reference to the pinned image."""
    info = inspect(pin.pinned_ref, run)
    return info is not None and _loaded_ok(pin, info)


def image_size(pin: ImagePin, run: Run = run_command) -> int:
    """The size local storage reports for the pinned image (for the disk-space check), 0 when unknown."""
    info = next((i for i in (inspect(src, run) for src in pin.sources) if i is not None), None)
    return int(info.get("Size") or 0) if info else 0


def inspect(ref: str, run: Run = run_command) -> dict[str, Any] | None:
    """``podman image inspect REF`` as a dict, or None when there is no such image."""
    proc = run(["podman", "image", "inspect", ref])
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return dict(data[0]) if isinstance(data, list) and data else None


def _loaded_ok(pin: ImagePin, info: dict[str, Any]) -> bool:
    image_id = "sha256:" + str(info.get("Id", "")).removeprefix("sha256:")
    digests = {str(d).rsplit("@", 1)[-1] for d in info.get("RepoDigests") or []} | {str(info.get("Digest"))}
    if pin.image_id is not None and image_id != pin.image_id:
        return False
    return pin.digest is None or pin.digest in digests


def load(pin: ImagePin, archive: Path, *, run: Run = run_command) -> str:
    """``podman load`` the archive, name it, and check local storage now runs the pinned image.

    Returns the image ID. Raises ImageMismatch naming both digests when the engine holds another image.
    """
    proc = _must(run, ["podman", "load", "-q", "-i", str(archive)])
    loaded = proc.stdout.decode(errors="replace").strip().splitlines()
    name = loaded[-1].split(":", 1)[1].strip() if loaded and ":" in loaded[-1] else ""
    info = inspect(name, run) if name else None
    if info is None:
        raise AdapterError(f"podman load -i {archive} reported {loaded!r}; no image found under that name")
    image_id = "sha256:" + str(info["Id"]).removeprefix("sha256:")
    if inspect(pin.pinned_ref, run) is None:
        _must(run, ["podman", "tag", image_id, pin.local_tag_ref])
    after = inspect(pin.pinned_ref, run)
    if after is None or not _loaded_ok(pin, after):
        got = (after or info).get("Digest")
        raise ImageMismatch(
            f"{archive.name}: loaded image {image_id} (manifest {got}) is not the {_want(pin)} the lock "
            "holds",
            hint="the bundle was made from another image; `invoke bundle OUT` again on the connected machine",
        )
    return image_id


def storage_root(run: Run = run_command) -> Path | None:
    """Where podman keeps images (for the disk-space check), or None when podman cannot say."""
    proc = run(["podman", "info", "--format", "{{.Store.GraphRoot}}"])
    text = proc.stdout.decode(errors="replace").strip()
    return Path(text) if proc.returncode == 0 and text else None


def _tail(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def _must(run: Run, argv: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    proc = run(argv)
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stderr.decode(errors="replace"))
    return proc
