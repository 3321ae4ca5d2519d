"""Image references: parse ``[registry/]repo[:tag][@sha256:…]`` the way Docker does. Pure (no network).

Shared by the importer, the registry adapter, the image definitions, the build and the plan, which must
not import the httpx/tenacity registry client to read a reference. In the core so that import refuses the
image deploy would refuse (a recipe's ``docker_image: --privileged`` would be a podman flag).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigsmith.errors import RigsmithError

DOCKER_HUB = "docker.io"
#: Where the Hub's registry API really lives.
DOCKER_HUB_API = "registry-1.docker.io"

#: What a reference's manifest may be: an index of platforms (OCI, Docker) or one image (OCI, Docker).
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"

# Anchored with \Z, not $: $ also matches before a trailing newline, which no reference may carry.
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}\Z", re.ASCII)
_REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. ``registry`` is the host[:port] as written (docker.io for the Hub)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """Fully qualified repository name, e.g. ``docker.io/vllm/vllm-openai``."""
        return f"{self.registry}/{self.repository}"

    @property
    def api_host(self) -> str:
        """Host[:port] that serves the /v2/ API."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def scheme(self) -> str:
        """Plain http only for registries on this machine; TLS everywhere else."""
        host = self.registry.rsplit(":", 1)[0] if not self.registry.startswith("[") else self.registry
        return "http" if host in _LOCAL_HOSTS or self.registry.startswith("[::1]") else "https"

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest if known, else the tag."""
        return self.digest or self.tag or "latest"

    def pinned(self, digest: str) -> str:
        """``name@digest``."""
        return f"{self.name}@{digest}"


def parse_ref(text: str) -> ImageRef:
    """Parse ``[registry/]repo[:tag][@sha256:…]`` the way Docker does (Hub names get ``library/``).

    Raises:
        RigsmithError: the text is not an image reference.
    """
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST_RE.match(digest):
            raise RigsmithError(
                f"image reference {text!r}: {digest!r} is not a sha256 digest",
                hint="write it as name@sha256:<64 hex digits>, or drop the @ part and run `invoke pin`",
            )
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG_RE.match(tag):
            raise RigsmithError(f"image reference {text!r}: {tag!r} is not a valid tag")
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, repo = first, remainder
    else:
        registry, repo = DOCKER_HUB, rest
        if "/" not in repo:
            repo = f"library/{repo}"
    if not _REPO_RE.match(repo):
        raise RigsmithError(
            f"image reference {text!r}: {repo!r} is not a valid repository name",
            hint="use lowercase letters, digits and . _ - separated by /",
        )
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry, repo, tag, digest)


#: A registry host as Docker's reference grammar has it (domain or IPv6 literal, optional port).
_REGISTRY_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
)


def image_problem(ref: str) -> str | None:
    """Why ``ref`` is not an image reference every target can write (one paragraph with what to do), or
    None. Every target writes it into a file (unit keys take it raw) or an argv where a word starting with
    ``-`` would be an option."""
    try:
        registry = parse_ref(ref).registry
    except RigsmithError as err:
        return err.message + (f"; {err.hint}" if err.hint else "")
    if not _REGISTRY_HOST.fullmatch(registry):
        # parse_ref takes any first component holding a '.' or ':' as the registry.
        return (
            f"image reference {ref!r}: {registry!r} is not a registry host[:port]; write e.g. "
            "registry.example.com:5000/name:tag"
        )
    return None
