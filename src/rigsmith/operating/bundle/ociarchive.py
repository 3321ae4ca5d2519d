"""The engine image as an OCI archive: export with its digest preserved, load, and check what landed.

Measured on podman 4.3.1 + skopeo 1.9.3: ``podman save --format oci-archive`` re-compresses the layers as
``podman push`` does, so for an image built, imported or pushed here the archive's manifest is byte for byte
the pushed one; for an image compressed elsewhere (Docker Hub) it is not, and ``skopeo copy
--preserve-digests docker://NAME@DIGEST oci-archive:…`` from the registry is the only faithful copy (skopeo
refuses one out of containers-storage: "would require changing layer representation"). So: podman first,
check, then skopeo from the registry, check. podman is found on PATH (tests put a wrapper first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigsmith.errors import AdapterError, CommandError, LockError, RigsmithError
from rigsmith.imageref import DOCKER_LIST, OCI_INDEX, parse_ref
from rigsmith.operating.probes import CmdResult
from rigsmith.resolving.lock.lock import Lock
from rigsmith.spec import Deployment

#: Runs argv to the end, capturing its output (``LocalHost.run``).
Run = Callable[[Sequence[str]], CmdResult]


class ImageMismatch(RigsmithError):
    """An image archive or a loaded image is not the one the lock pins."""


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

    @property
    def wanted(self) -> str:
        return f"manifest {self.digest}" if self.digest else f"image ID {self.image_id}"


def image_pin(spec: Deployment, lock: Lock) -> ImagePin | None:
    """What ``deploy`` would run for ``spec``, from the lock; None for a venv engine (no image). Raises
    LockError when the image is not pinned (an unpinned tag would travel unverifiable)."""
    ref, build = spec.engine.image, spec.engine.build
    if spec.engine.runtime == "venv":
        return None
    if ref:
        parsed, locked = parse_ref(ref), lock.images.get(ref)
        name = ref.split("@", 1)[0].removesuffix(f":{parsed.tag}" if parsed.tag else "")
        digest = parsed.digest or (locked.digest if locked else None)
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
        tag, pinned = parsed.tag if parsed.tag and "@" not in ref else None, f"{name}@{digest}"
        return ImagePin(name, tag, digest, None, pinned, (pinned, ref) if tag else (pinned,))
    if (built := lock.builds.get(build) if build else None) is not None:
        tag = (built.inputs_sha256 or "").removeprefix("sha256:")[:16] or None
        names = (built.digest and f"{built.ref}@{built.digest}", tag and f"{built.ref}:{tag}", built.image_id)
        return ImagePin(
            built.ref, tag, built.digest, built.image_id, built.pinned_ref, tuple(filter(None, names))
        )
    what = f"image build {build!r}, not in rigsmith.lock" if build else "no image"
    raise LockError(
        f"deployment {spec.name!r} runs {what}: there is no pinned image to bundle",
        hint=f"run `invoke build --image {build}` first"
        if build
        else "set engine.image (and `invoke pin`) or engine.build (and `invoke build`)",
    )


@dataclass(frozen=True)
class ArchiveFacts:
    """The image an OCI archive holds: its manifest digest and config digest (the image ID)."""

    manifest_digest: str
    config_digest: str


def archive_facts(path: Path, member: str = "image archive") -> ArchiveFacts:
    """Read index.json and the manifest of a one-image OCI archive, checking the manifest's hash; raises
    ImageMismatch for anything else."""

    def bad(why: str) -> ImageMismatch:
        return ImageMismatch(
            f"{member}: {why}",
            hint="bundle again with `invoke bundle OUT` (the archive is damaged or not OCI)",
        )

    try:
        with tarfile.open(path, "r:") as tar:
            manifests = json.loads(_member_bytes(tar, "index.json")).get("manifests") or []
            if len(manifests) != 1:
                raise bad(f"index.json lists {len(manifests)} images, not one")
            digest = str(manifests[0].get("digest", ""))
            raw = _member_bytes(tar, "blobs/" + digest.replace(":", "/", 1))
        if (actual := "sha256:" + hashlib.sha256(raw).hexdigest()) != digest:
            raise bad(f"the manifest hashes to {actual}, index.json says {digest}")
        config = json.loads(raw).get("config", {}).get("digest")
    except (tarfile.TarError, OSError, ValueError, AttributeError) as err:  # AttributeError: not an object
        raise bad(f"cannot read it as an OCI archive ({err})") from None
    if not isinstance(config, str):
        raise bad("the manifest names no config")
    return ArchiveFacts(digest, config)


def _member_bytes(tar: tarfile.TarFile, name: str) -> bytes:
    for candidate in (name, f"./{name}"):
        with contextlib.suppress(KeyError):
            if (fh := tar.extractfile(candidate)) is not None:
                return fh.read()
    raise ValueError(f"no {name} in the archive")


def matches(pin: ImagePin, facts: ArchiveFacts) -> bool:
    """True when the archive is the pinned image (manifest digest when the lock has one, else the ID)."""
    if pin.digest is not None and facts.manifest_digest != pin.digest:
        return False
    return pin.image_id is None or facts.config_digest == pin.image_id


def export(pin: ImagePin, dest: Path, *, run: Run, echo: Callable[[str], None]) -> ArchiveFacts:
    """Write the pinned image to ``dest`` as an OCI archive whose digest is the lock's (``podman save`` of a
    local name, else ``skopeo copy`` from the registry), or fail saying why; no other archive is left."""
    echo(f"bundle: exporting {pin.pinned_ref} as an OCI archive")
    tried: list[str] = []
    for src in pin.sources:
        if run(["podman", "image", "exists", src]).code != 0:
            tried.append(f"{src}: not in local storage")
            continue
        dest.unlink(missing_ok=True)
        _must(run, ["podman", "save", "--format", "oci-archive", "-o", str(dest), src])
        if matches(pin, facts := archive_facts(dest)):
            return facts
        tried.append(f"podman save {src}: manifest {facts.manifest_digest}, image ID {facts.config_digest}")
        break  # the same local image under another name saves the same bytes
    if pin.digest is not None and (ref := parse_ref(f"{pin.name}@{pin.digest}")).registry != "localhost":
        echo(f"bundle: copying {pin.name}@{pin.digest} from its registry (skopeo, digests preserved)")
        dest.unlink(missing_ok=True)
        tls = ["--src-tls-verify=false"] if ref.scheme == "http" else []
        proc = run(["skopeo", "copy", "--preserve-digests", "--quiet", *tls, f"docker://{pin.name}@{pin.digest}",
                    f"oci-archive:{dest}:{pin.local_tag_ref}"])  # fmt: skip
        if proc.code != 0:
            tried.append(f"skopeo copy: exit {proc.code}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
        elif matches(pin, facts := archive_facts(dest)):
            return facts
        else:
            tried.append(f"skopeo copy: manifest {facts.manifest_digest}")
    dest.unlink(missing_ok=True)
    raise ImageMismatch(
        f"cannot export {pin.pinned_ref} with the {pin.wanted} the lock holds; tried: " + "; ".join(tried),
        hint=f"pull it by digest (`podman pull {pin.pinned_ref}`) or make the registry reachable, then "
        "`invoke bundle OUT` again",
    )


def present(pin: ImagePin, run: Run) -> bool:
    """True when local storage resolves the pinned reference to the pinned image."""
    if (info := inspect(pin.pinned_ref, run)) is None:
        return False
    digests = {str(d).rsplit("@", 1)[-1] for d in info.get("RepoDigests") or []} | {str(info.get("Digest"))}
    if (
        pin.image_id is not None
        and "sha256:" + str(info.get("Id", "")).removeprefix("sha256:") != pin.image_id
    ):
        return False
    return pin.digest is None or pin.digest in digests


def image_size(pin: ImagePin, run: Run) -> int:
    """The size local storage reports for the pinned image (for the disk-space check), 0 when unknown."""
    return next((int(i.get("Size") or 0) for i in (inspect(src, run) for src in pin.sources) if i), 0)


def inspect(ref: str, run: Run) -> dict[str, Any] | None:
    """``podman image inspect REF`` as a dict, or None when there is no such image."""
    proc = run(["podman", "image", "inspect", ref])
    data = json.loads(proc.stdout) if proc.code == 0 else None
    return dict(data[0]) if isinstance(data, list) and data else None


def load(pin: ImagePin, archive: Path, *, run: Run) -> None:
    """``podman load`` the archive, name it, and check local storage now runs the pinned image (else
    ImageMismatch, naming both)."""
    loaded = _must(run, ["podman", "load", "-q", "-i", str(archive)]).stdout.strip().splitlines()
    name = loaded[-1].split(":", 1)[1].strip() if loaded and ":" in loaded[-1] else ""
    if (info := inspect(name, run) if name else None) is None:
        raise AdapterError(f"podman load -i {archive} reported {loaded!r}; no image found under that name")
    image_id = "sha256:" + str(info["Id"]).removeprefix("sha256:")
    if inspect(pin.pinned_ref, run) is None:
        _must(run, ["podman", "tag", image_id, pin.local_tag_ref])
    if not present(pin, run):
        raise ImageMismatch(
            f"{archive.name}: loaded image {image_id} (manifest {info.get('Digest')}) is not the "
            f"{pin.wanted} the lock holds",
            hint="the bundle was made from another image; `invoke bundle OUT` again on the connected machine",
        )


def storage_root(run: Run) -> Path | None:
    """Where podman keeps images (for the disk-space check), or None when podman cannot say."""
    proc = run(["podman", "info", "--format", "{{.Store.GraphRoot}}"])
    return Path(proc.stdout.strip()) if proc.code == 0 and proc.stdout.strip() else None


def _must(run: Run, argv: Sequence[str]) -> CmdResult:
    proc = run(argv)
    if proc.code != 0:
        raise CommandError(argv, proc.code, proc.stderr)
    return proc
