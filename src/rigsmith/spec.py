"""The deployment spec: ``deployments/NAME.yaml`` as frozen, validated models.

Everything a target renders comes from here (plus ``rigsmith.lock``). The models reject unknown fields,
collect every validation problem with its field path, and round-trip: ``load(dump(x)) == x``.
"""

# Over 500 lines: the models are one schema (exported as JSON Schema), with the load/dump every reader of a
# spec goes through beside them. YAML hardening is yamldoc; which host paths need consent is policy.

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rigsmith.errors import SpecError
from rigsmith.modeldir import HINT as MODEL_DIR_HINT
from rigsmith.modeldir import model_dir_problem, not_its_own
from rigsmith.placement import placement_problem
from rigsmith.yamldoc import MAX_DEPTH, load_yaml, nul_paths, tree_problem, yaml_problem

SPEC_VERSION: Literal[1] = 1
#: First line of a spec file import-recipe writes: editors with the YAML language server validate and
#: complete it against the schema (``invoke schema``). A comment, so the model never sees it.
MODELINE = "# yaml-language-server: $schema=../schema/deployment.schema.json\n"

#: A Hugging Face Hub repo id, owner/name.
HUB_REPO_RE = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
#: A placeholder token in a recipe value: ``<repo>``, ``<vllm tree>``, ``<n_of_tokens>``, ``<1>`` ($1).
PLACEHOLDER_RE = re.compile(r"<(?:[A-Za-z_][A-Za-z0-9_ .-]*|[1-9][0-9]*)>")
# Anchored with \Z, not $: `$` also matches before a trailing newline, and targets write these bare.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
#: ``$NAME`` or ``${NAME}``: a value read from the host's variable NAME.
HOST_REF_RE = re.compile(r"^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})\Z")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)(i?b?)\Z", re.IGNORECASE | re.ASCII)
CDI_RE = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+=[A-Za-z0-9_.:-]+\Z")
SHA1_RE = re.compile(r"^[0-9a-f]{40}\Z")
_ASCII_INT_RE = re.compile(r"[0-9]+\Z")
#: Most GPUs one node gives a container. The largest nodes sold carry 8-16; 64 leaves room for any real
#: machine while a recipe's ``--gpus 3000000`` cannot make every target write three million CDI names.
MAX_GPUS = 64


def hub_repo_id(v: str) -> bool:
    """``v`` is a repo id the Hub accepts, ``owner/name``: ``HUB_REPO_RE`` plus the rules of
    huggingface_hub's ``validate_repo_id`` (no ``--`` or ``..``, no ``.git`` or ``.``/``-`` at the end of
    a part, at most 96 characters a part), so what passes here is never refused later by the Hub client."""
    parts = v.split("/")
    return (
        re.fullmatch(HUB_REPO_RE, v) is not None
        and "--" not in v
        and ".." not in v
        and not v.endswith(".git")
        and all(len(p) <= 96 and not p.endswith((".", "-")) for p in parts)
    )


def repeated(values: Iterable[str]) -> list[str]:
    """The values that stand more than once, sorted (each named once)."""
    seen = list(values)
    return sorted({v for v in seen if seen.count(v) > 1})


def ascii_int(text: str) -> int | None:
    """``text`` as a non-negative whole number written in ASCII digits, else None.

    ``int()`` and ``str.isdigit()`` accept other scripts' digits (``²``, ``٣``), which vLLM, podman and
    shells do not; every count or port read from a recipe or spec goes through here.
    """
    return int(text) if _ASCII_INT_RE.match(text) else None


def parse_size(text: str) -> int:
    """Bytes in a podman-style size (``8g``, ``1GB``, ``512m``, ``102400491520``); binary units."""
    m = SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size; write it like 8g, 512m or a byte count")
    num, unit = float(m.group(1)), m.group(2).lower()
    return int(num * 1024 ** "_kmgt".index(unit)) if unit else int(num)


def container_abs(v: str) -> str:
    """``v`` when it is an absolute container path, else ValueError."""
    if not v.startswith("/"):
        raise ValueError("must be an absolute path inside the container")
    return v


class Frozen(BaseModel):
    """Base of every spec model: immutable, no unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ConfigPatch(Frozen):
    """A change to a JSON file of the checkpoint, applied after the download is verified."""

    file: str = Field("config.json", description="File in the model dir, relative.")
    key: str = Field(description="Dotted path inside the JSON, e.g. text_config.ple_embedding_dtype.")
    value: Any = Field(description="Value to set.")
    note: str | None = None

    @field_validator("file")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts:
            raise ValueError("must be a path inside the model dir (no leading /, no ..)")
        return v


class ModelSpec(Frozen):
    """The checkpoint: where it comes from on the Hub and where it lives on the host.

    ``repo: null`` is a local checkpoint: ``local_dir`` already holds it, rigsmith downloads and pins nothing
    (so ``revision`` and the download patterns have no meaning there).
    """

    repo: str | None = Field(
        None,
        description="Hugging Face repo id, owner/name; null for a checkpoint already on disk at local_dir "
        "(rigsmith then downloads and pins nothing); a placeholder token such as '<MODEL>' (a variable the "
        "recipe never set) until placeholders gives its value.",
    )
    revision: str | None = Field(
        None, description="40-hex commit (pinned) or a branch/tag that `invoke pin` resolves into the lock."
    )
    local_dir: str = Field(description="Host directory the checkpoint is downloaded to (may start with ~/).")
    container_path: str = Field("/model", description="Where local_dir is mounted inside the container.")
    size_bytes: int | None = Field(None, ge=0, description="Expected total size, for the disk check.")
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    config_patches: tuple[ConfigPatch, ...] = ()

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not hub_repo_id(v) and not PLACEHOLDER_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a Hub repo id; write it as owner/name (or null for a checkpoint already in "
                "local_dir)"
            )
        return v

    @field_validator("revision", "allow_patterns", "ignore_patterns")
    @classmethod
    def _hub_only(cls, v: Any, info: ValidationInfo) -> Any:
        # repo is declared first, so it is in info.data unless it failed its own check.
        if v and "repo" in info.data and info.data["repo"] is None:
            raise ValueError(
                f"needs a Hub repo, but model.repo is null (a checkpoint already in local_dir); remove "
                f"{info.field_name} or set repo to owner/name"
            )
        return v

    @property
    def local(self) -> bool:
        """A checkpoint already on disk: nothing to download, pin or verify against the Hub."""
        return self.repo is None

    @field_validator("container_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        return container_abs(v)

    @property
    def pinned(self) -> bool:
        """True when the revision is already a full commit sha."""
        return self.revision is not None and bool(SHA1_RE.match(self.revision))


class SecondaryModel(Frozen):
    """A Hub model the engine loads besides ``model``: a speculative draft model (``--speculative-config``
    ``"model"``), a tokenizer (``--tokenizer``) or a LoRA adapter (``--lora-modules NAME=REPO``).

    Recorded so it can be locked, fetched and mounted like the main model; ``arg`` is the index in
    ``engine.args`` of the word that names it.
    """

    role: Literal["speculative", "tokenizer", "lora"]
    repo: str = Field(description="Hugging Face repo id, owner/name.")
    revision: str | None = Field(None, description="Commit or branch; null: the default branch at pin time.")
    name: str | None = Field(None, description="The LoRA adapter's name (``--lora-modules NAME=REPO``).")
    arg: int = Field(ge=0, description="Index in engine.args of the word that names the model.")
    local_dir: str | None = Field(
        None,
        description="Host directory it is fetched into (null: a sibling of model.local_dir named after the "
        "repo; a dedicated directory, like model.local_dir).",
    )
    container_path: str | None = Field(
        None, description="Where local_dir is mounted (read-only) in the container (null: /models/DIRNAME)."
    )
    allow_patterns: tuple[str, ...] = Field(
        (), description="Files fetched (empty: every file; a tokenizer: its tokenizer and config files)."
    )

    @field_validator("container_path")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        return None if v is None else container_abs(v)

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not hub_repo_id(v):
            raise ValueError(f"{v!r} is not a Hub repo id; write it as owner/name")
        return v


class EngineSpec(Frozen):
    """How vLLM is started: the recipe argv, kept exact, plus the explicit model-path mapping."""

    runtime: Literal["container", "venv"] = "container"
    image: str | None = Field(
        None, description="Container image reference; prefer name@sha256:… (see `invoke build`/`pin`)."
    )
    build: str | None = Field(None, description="Name under images/ whose locked build digest is the image.")
    venv: str | None = Field(None, description="venv directory when runtime is venv.")
    recipe_executable: str = Field("vllm", description="The executable as the recipe wrote it.")
    executable: str = Field("vllm", description="What runs inside the container (its entrypoint).")
    subcommand: tuple[str, ...] = Field(("serve",), description="argv between executable and args.")
    args: tuple[str, ...] = Field(description="The recipe's argv after the subcommand, byte for byte.")
    model_arg: int | None = Field(
        None,
        description="Index in args of the model path, replaced by model.container_path in the container.",
    )

    @field_validator("build")
    @classmethod
    def _build(cls, v: str | None) -> str | None:
        # A directory under images/, a bundle member's folder and an image name: an image definition's name.
        if v is not None and not NAME_RE.match(v):
            raise ValueError(
                f"{v[:100]!r} is not the name of an image definition under images/ (lowercase letters, "
                "digits, '.', '_' or '-', max 63, start alnum)"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> EngineSpec:
        if self.model_arg is not None and not 0 <= self.model_arg < len(self.args):
            raise ValueError(f"model_arg {self.model_arg} is outside args (0..{len(self.args) - 1})")
        if self.image is not None and self.build is not None:
            raise ValueError("set image or build, not both")
        return self

    def container_argv(self, model: ModelSpec) -> list[str]:
        """The exact command the container runs: subcommand + args, model path mapped."""
        return self.argv_with_model(model.container_path)

    def argv_with_model(self, path: str) -> list[str]:
        """Subcommand + args with the model word (if any) pointing at ``path``."""
        args = list(self.args)
        if self.model_arg is not None:
            flag, eq, _ = args[self.model_arg].partition("=")
            # `--model=PATH` is one word: only its value is the model path.
            args[self.model_arg] = f"{flag}={path}" if eq and flag.startswith("-") else path
        return [*self.subcommand, *args]

    def flag_value(self, flag: str) -> str | None:
        """Value of ``--flag V`` or ``--flag=V`` (last one wins, as argparse does)."""
        found: str | None = None
        for i, a in enumerate(self.args):
            if a == flag and i + 1 < len(self.args):
                found = self.args[i + 1]
            elif a.startswith(flag + "="):
                found = a.split("=", 1)[1]
        return found


def matching(pattern: re.Pattern[str], problem: str) -> AfterValidator:
    """A string ``pattern`` matches; else ``problem`` (``{v!r}`` is the value) is the error."""

    def check(v: str) -> str:
        if not pattern.match(v):
            raise ValueError(problem.format(v=v))
        return v

    return AfterValidator(check)


class EnvVar(Frozen):
    """One environment variable of the recipe."""

    name: Annotated[str, matching(ENV_NAME_RE, "{v!r} is not an environment variable name")]
    value: str
    note: str | None = Field(None, description="The recipe's annotation, verbatim.")
    opt_in: bool = Field(False, description="Published as optional; off unless enabled.")
    enabled: bool = Field(True, description="Opt-in variables start disabled; set true to pass them.")
    secret: bool = Field(False, description="Never written into a generated file; read from an env file.")
    read_by: str | None = Field(
        None,
        description="A switch only the recipe's own script reads (e.g. scripts/serve-v2.5.sh): passed only "
        "when engine.executable is that script.",
    )

    @property
    def active(self) -> bool:
        """Passed to the container."""
        return self.enabled

    @property
    def host_source(self) -> str:
        """The host variable a secret is read from: its own name, or ``OTHER`` for ``value: $OTHER``
        (``--env HUGGING_FACE_HUB_TOKEN=$HF_TOKEN``: the container's NAME gets the host's OTHER)."""
        m = HOST_REF_RE.match(self.value) if self.secret else None
        return (m.group(1) or m.group(2)) if m else self.name


def cdi_names(v: tuple[str, ...]) -> tuple[str, ...]:
    """``v`` when every entry is a fully qualified CDI name, else ValueError naming the others."""
    bad = [d for d in v if not CDI_RE.match(d)]
    if bad:
        raise ValueError(f"{bad} are not CDI names; write vendor.com/class=name, e.g. nvidia.com/gpu=0")
    return v


class GpuSpec(Frozen):
    """The GPUs the recipe needs and the CDI names that give them to a container."""

    count: int = Field(ge=0, le=MAX_GPUS)
    model: str | None = Field(None, description="e.g. RTX 3090")
    arch: str | None = Field(None, description="e.g. sm_86")
    vram_gib: float | None = Field(None, ge=0, description="Per GPU.")
    cdi_devices: tuple[str, ...] = Field(
        max_length=MAX_GPUS, description="Fully qualified CDI names, e.g. nvidia.com/gpu=0."
    )
    p2p: Literal["required", "recommended", "not-needed", "unknown"] = "unknown"
    nvlink: bool | None = None

    @field_validator("cdi_devices")
    @classmethod
    def _cdi(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return cdi_names(v)


class Resources(Frozen):
    """Host resources and container limits."""

    gpus: GpuSpec
    host_ram_gib: float | None = Field(None, ge=0)
    disk_gib: float | None = Field(None, ge=0)
    shm_size: str = Field("8g", description="/dev/shm size for the container (podman --shm-size syntax).")
    memlock: Literal["unlimited", "host"] | int = Field(
        "unlimited",
        description="RLIMIT_MEMLOCK: unlimited, bytes, or host (inherit the runtime's limit, set nothing; "
        "for "
        "hosts such as unprivileged LXC that cannot raise it).",
    )
    stop_grace_seconds: int = Field(70, gt=0, description="Container stop timeout (SIGTERM → SIGKILL).")

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        parse_size(v)
        return v

    @property
    def shm_bytes(self) -> int:
        """shm_size in bytes."""
        return parse_size(self.shm_size)


class Mount(Frozen):
    """A host path made visible inside the container."""

    host: str
    container: str
    readonly: bool = False
    kind: Literal["dir", "file"] = "dir"
    sparse_size: int | None = Field(
        None, ge=1, description="File mounts: must pre-exist at exactly this size; created sparse if missing."
    )
    note: str | None = None
    consent: str | None = Field(
        None,
        description="Your reason for mounting a dangerous host path (/, a home directory, a socket, /etc, "
        "/dev, the container engine's storage, a dot-directory); import asks for it and deploy refuses such "
        "a mount without it.",
    )

    @model_validator(mode="after")
    def _check(self) -> Mount:
        if not self.container.startswith("/"):
            raise ValueError("container must be an absolute path")
        if self.sparse_size is not None and self.kind != "file":
            raise ValueError("sparse_size needs kind: file")
        if self.kind == "file" and self.host.rsplit("/", 1)[-1] in ("", ".", "..", "~"):
            raise ValueError(
                f"host {self.host!r} names a directory, not a file (kind: file); write the file's path"
            )
        return self


class Readiness(Frozen):
    """When the deployment counts as up: the recipe's gates."""

    health_path: str = "/health"
    log_lines: tuple[str, ...] = ("Application startup complete",)
    kv_cache_tokens: int | None = Field(None, ge=0, description="Published 'GPU KV cache size: N tokens'.")
    kv_cache_tolerance: float = Field(0.02, ge=0, le=1, description="Relative tolerance on kv_cache_tokens.")
    startup_seconds: int = Field(600, gt=0, description="Expected first-boot time; timeouts derive from it.")
    warm_startup_seconds: int | None = Field(None, gt=0)


class Network(Frozen):
    """Where the OpenAI-compatible server listens."""

    mode: Literal["host", "none"] = "host"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    listen: str | None = Field(
        None,
        description="The address every target makes vLLM listen on (--host LISTEN replaces the args' --host, "
        "or is added). Import sets it when a container recipe published the API on one address only "
        "(-p 127.0.0.1:8000:8000): the targets run with host networking, where vLLM's own bind address is "
        "the exposure. null: the args decide.",
    )

    @field_validator("listen")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 or IPv6 address (write e.g. 127.0.0.1 or ::1)") from None
        return v


class Benchmark(Frozen):
    """A published number the deployment is qualified against."""

    name: str = Field(description="e.g. decode_1stream")
    streams: int = Field(1, ge=1)
    tokens_per_second: float = Field(gt=0)
    tolerance: float = Field(0.1, ge=0, le=1)


#: How a ``not_taken`` item that is the recipe's own image (a digest that cannot be pulled) begins.
IMAGE_NOT_TAKEN = "pinned by image digest"


class NotTaken(Frozen):
    """An item of the recipe that is in no field and no note on purpose, and why (import writes these)."""

    item: str = Field(description="The item, as the recipe writes it.")
    why: str = Field(description="Why it was not taken, and what stands in for it.")


class Provenance(Frozen):
    """Where an imported recipe came from."""

    source: str
    sha256: str
    title: str | None = None
    recipe_id: str | None = None

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("must be 64 lowercase hex digits")
        return v


class Proxy(Frozen):
    """Registration with a model-switching proxy (llama-swap, a seed's multi-proxy)."""

    family: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    backend_managed: bool = False


#: An interface name as the kernel takes it (IFNAMSIZ 16 with the NUL; no '/', ':' or whitespace).
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}\Z")
#: A node address: an IPv4/IPv6 literal or a host name, or a placeholder token until the user fills it.
ADDRESS_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|[0-9A-Fa-f:.]+|<[A-Za-z_][A-Za-z0-9_ .-]*>)\Z"
)


DEFAULT_NODE_DIR = "/var/lib/rigsmith"
#: cluster.node_dir: the characters a remote shell word may hold unquoted (it is quoted anyway).
NODE_DIR_RE = re.compile(r"^(?:/[A-Za-z0-9_+@-][A-Za-z0-9._+@-]{0,254}){1,32}\Z")
#: Node fields written into commands and env on every node: (pattern, what a valid value is).
_NODE_WORDS = {
    "name": (
        re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?\Z"),
        "a node name: lowercase letters, digits and '-' (max 32), alnum at both ends",
    ),
    "address": (ADDRESS_RE, "an IP address or host name"),
    "interface": (IFNAME_RE, "a network interface name (e.g. enp65s0, at most 15 characters)"),
    # Passed to ssh as its destination word: no leading '-' (ssh would read an option such as
    # -oProxyCommand=…), no spaces or control characters, an optional login name then a host.
    "ssh": (
        re.compile(
            r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}@)?(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]+)\Z"
        ),
        "an ssh destination, user@host or host (no leading '-', spaces or control characters)",
    ),
}


#: A file ssh reads (a key, a known-hosts file): absolute or ~/, no '%' or '$' (ssh expands %-tokens and
#: ${VAR} in these), no quote, '#', space or control character (ssh splits and quotes -o values itself).
_SSH_FILE = (
    re.compile(r"^(?:/|~/)[A-Za-z0-9._/+@,-]{0,4094}\Z"),
    "an absolute or ~/ path of letters, digits and . _ / + @ , - (no %-tokens, $VAR, quotes or spaces)",
)
_SSH_COUNT = (re.compile(r"^[0-9]{1,5}\Z"), "a whole number")
_PORT_RE = r"^(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])\Z"
#: ssh_config keywords a node's ``ssh_options`` may set (ssh ``-o KEY=VALUE``), each with the exact shape of
#: its value: how to authenticate and whom to trust, never what runs locally (no ProxyCommand, LocalCommand,
#: KnownHostsCommand, Match exec, Include…). A user or alias name is held to a host-name shape because the
#: user's own ~/.ssh/config may expand it (%r, %k) into a shell command (CVE-2023-51385).
SSH_OPTIONS: dict[str, tuple[re.Pattern[str], str]] = {
    "ConnectTimeout": _SSH_COUNT,
    "HostKeyAlias": (
        re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z"),
        "a host name (letters, digits, . _ -)",
    ),
    "IdentitiesOnly": (re.compile(r"^(?:yes|no)\Z"), "yes or no"),
    "IdentityFile": _SSH_FILE,
    "Port": (re.compile(_PORT_RE), "a port number, 1 to 65535"),
    "ServerAliveCountMax": _SSH_COUNT,
    "ServerAliveInterval": _SSH_COUNT,
    "StrictHostKeyChecking": (
        re.compile(r"^(?:yes|no|accept-new|ask|off)\Z"),
        "yes, no, accept-new, ask or off",
    ),
    "User": (re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\Z"), "a login name (letters, digits, _ . -)"),
    "UserKnownHostsFile": _SSH_FILE,
}
SSH_OPTION_KEYS = tuple(SSH_OPTIONS)


class ClusterNode(Frozen):
    """One machine of a multi-node deployment: where it is, which GPUs it gives, which link it talks on."""

    name: str = Field(description="Short node name, used in artifact names (e.g. node0, box-a).")
    address: str = Field(
        description="The node's address on the inter-node network (VLLM_HOST_IP, Ray's --node-ip-address); "
        "a placeholder such as '<node0 address>' until you fill it."
    )
    interface: str | None = Field(
        None, description="Network interface NCCL and Gloo must use (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)."
    )
    cdi_devices: tuple[str, ...] = Field(
        min_length=1, max_length=MAX_GPUS, description="This node's GPUs as CDI names, e.g. nvidia.com/gpu=0."
    )
    ssh: str | None = Field(
        None,
        description="How ops reach this node: an ssh destination (user@host) run with `ssh -o BatchMode=yes` "
        "(null: the node is this machine, or run `invoke doctor --node NAME` on it).",
    )
    ssh_options: dict[str, str] = Field(
        default_factory=dict,
        description="ssh_config settings for reaching this node (ssh -o KEY=VALUE), e.g. IdentityFile, "
        "UserKnownHostsFile, Port; only " + ", ".join(SSH_OPTION_KEYS) + ".",
    )
    args: tuple[str, ...] | None = Field(
        None,
        description="data-parallel only: this node's argv after the subcommand, byte for byte, when the "
        "recipe gave one per node (null: engine.args with this node's rank flags set).",
    )

    @field_validator("name", "address", "interface", "ssh")
    @classmethod
    def _word(cls, v: str | None, info: ValidationInfo) -> str | None:
        pattern, what = _NODE_WORDS[info.field_name or ""]
        if v is not None and not pattern.match(v):
            raise ValueError(f"{v!r} is not {what}")
        return v

    @field_validator("cdi_devices")
    @classmethod
    def _node_cdi(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return cdi_names(v)

    @field_validator("ssh_options")
    @classmethod
    def _ssh_options(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if key not in SSH_OPTION_KEYS:
                raise ValueError(
                    f"{key!r} is not one of the ssh options rigsmith passes: {', '.join(SSH_OPTION_KEYS)}"
                )
            pattern, what = SSH_OPTIONS[key]
            if not pattern.match(value):
                raise ValueError(f"{key}: {value[:100]!r} is not {what}")
        return v


def _node_dir_place(parts: list[str]) -> str | None:
    """The model-dir rule's system and shared trees (:func:`rigsmith.modeldir.not_its_own`), except a state
    directory of its own below /var/lib, /var/opt or /var/local, where the FHS puts what a program keeps
    (the default node_dir is one)."""
    state = len(parts) >= 3 and parts[:2] in (["var", "lib"], ["var", "opt"], ["var", "local"])
    return None if state else not_its_own(parts)


class Cluster(Frozen):
    """Several nodes serving one model: a Ray cluster (head + workers) or vLLM data-parallel ranks.

    The first node is the head (Ray) or rank 0 with the API server (data parallel). Every node runs the
    same image digest and the same locked model.
    """

    layout: Literal["ray", "data-parallel"] = Field(
        description="ray: Ray head on the first node, workers join it, vllm serve runs on the head with "
        "--distributed-executor-backend ray. data-parallel: every node runs vllm serve for its ranks, the "
        "others with --headless."
    )
    nodes: tuple[ClusterNode, ...] = Field(description="Two or more; the head (rank 0) first.")
    ray_port: int = Field(6379, ge=1, le=65535, description="Ray GCS port on the head.")
    dp_rpc_port: int = Field(13345, ge=1, le=65535, description="--data-parallel-rpc-port on the first node.")
    join_timeout_seconds: int = Field(
        600, gt=0, description="How long the head waits for every node and GPU (workers for the head)."
    )
    node_dir: str = Field(
        DEFAULT_NODE_DIR,
        description="Absolute directory on each node reached over ssh where `invoke up` copies that node's "
        "generated artifacts (run.sh, stop.sh) before running them.",
    )

    @field_validator("node_dir")
    @classmethod
    def _node_dir(cls, v: str) -> str:
        # Written to and run from over ssh on every node: a plain, normalised path of its own, not the
        # root, not a dot-directory, nothing a remote shell could read as more than one word.
        parts = v.split("/")[1:]
        why = (
            "is not absolute" if not v.startswith("/")
            else "is the root directory" if v.strip("/") == ""
            else "has an empty ('//' or a trailing '/'), '.' or '..' part"
            if any(p in ("", ".", "..") for p in parts)
            else "has a dot-directory part" if any(p.startswith(".") for p in parts)
            else "holds a character other than letters, digits and . _ + @ - /" if not NODE_DIR_RE.match(v)
            else f"is {place}" if (place := _node_dir_place(parts))
            else None
        )  # fmt: skip
        if why:
            raise ValueError(
                f"{v[:200]!r} {why}; use a dedicated absolute directory such as {DEFAULT_NODE_DIR}"
            )
        return v

    @field_validator("nodes", mode="before")
    @classmethod
    def _two(cls, v: Any) -> Any:
        # Checked before the items: pydantic's min_length counts only the nodes that validated.
        if isinstance(v, list | tuple) and len(v) < 2:
            raise ValueError(f"has {len(v)} node(s); a cluster needs two or more (or remove cluster)")
        return v


class Deployment(Frozen):
    """A deployment spec, as stored in ``deployments/NAME.yaml``."""

    version: Literal[1] = SPEC_VERSION
    name: Annotated[
        str, matching(NAME_RE, "{v!r}: use lowercase letters, digits, '.', '_' or '-' (max 63), start alnum")
    ]
    description: str | None = None
    model: ModelSpec
    secondary_models: tuple[SecondaryModel, ...] = Field(
        (), description="Hub models the engine loads besides model (draft, tokenizer, LoRA adapters)."
    )
    engine: EngineSpec
    env: tuple[EnvVar, ...] = ()
    env_notes: tuple[str, ...] = Field((), description="Free-text annotations of the recipe's env, verbatim.")
    placeholders: dict[str, str | None] = Field(
        default_factory=dict,
        description="Placeholder tokens found in the recipe (e.g. '<repo>') and the user's values; "
        "deploy refuses while any is null.",
    )
    resources: Resources
    mounts: tuple[Mount, ...] = ()
    readiness: Readiness = Readiness()
    network: Network = Network()
    benchmarks: tuple[Benchmark, ...] = ()
    proxy: Proxy | None = None
    podman_version: str | None = Field(None, description="Target host's podman version, e.g. 4.9.3.")
    notes: tuple[str, ...] = Field((), description="What the recipe said that has no field, verbatim.")
    not_taken: tuple[NotTaken, ...] = Field(
        (),
        description="Items of the recipe deliberately not imported, each with the reason (a record's ops "
        "commands, a truncated digest, a comparison with another engine).",
    )
    provenance: Provenance | None = None
    cluster: Cluster | None = Field(None, description="Several nodes serving this model (null: one host).")

    @model_validator(mode="before")
    @classmethod
    def _filled_model(cls, data: Any) -> Any:
        """A model that is a placeholder (``model.repo: <MODEL>``) is what ``placeholders`` gives it, once
        given: a Hub repo, or a checkpoint's directory on disk (then model.repo is null and local_dir that
        directory); the token in local_dir and container_path becomes its name."""
        if not isinstance(data, dict) or not isinstance(model := data.get("model"), dict):
            return data
        token, filled = model.get("repo"), data.get("placeholders")
        if not (isinstance(token, str) and PLACEHOLDER_RE.fullmatch(token) and isinstance(filled, dict)):
            return data
        value = filled.get(token)
        if not isinstance(value, str) or not value.strip():
            return data
        local = value.startswith(("/", "~/"))
        if not local and not hub_repo_id(value):
            raise ValueError(
                f"placeholders[{token!r}]: {value!r} is the model (model.repo is {token}) and must be its "
                "Hub repo id (owner/name) or the absolute (or ~/) directory of a checkpoint already on disk"
            )
        # The directory becomes model.local_dir: the model-dir rule of every other model dir, said here
        # where the user wrote it.
        why = model_dir_problem(value, "") if local else None
        if why:
            raise ValueError(
                f"placeholders[{token!r}]: {value!r} is the model's directory, but {why}; {MODEL_DIR_HINT}"
            )
        name = value.rstrip("/").rsplit("/", 1)[-1]
        paths = {
            k: v.replace(token, name)
            for k in ("local_dir", "container_path")
            if isinstance(v := model.get(k), str)
        }
        if local:
            return {**data, "model": {**model, **paths, "repo": None, "local_dir": value}}
        return {**data, "model": {**model, "repo": value, **paths}}

    @model_validator(mode="after")
    def _cross(self) -> Deployment:
        dup = repeated(e.name for e in self.env if e.active)
        if dup:
            raise ValueError(f"env: {dup} set more than once among enabled variables")
        dupm = repeated([m.container for m in self.mounts] + [self.model.container_path])
        if dupm:
            raise ValueError(f"mounts: container paths {dupm} used twice (model.container_path counts)")
        for i, sm in enumerate(self.secondary_models):
            if sm.arg >= len(self.engine.args):
                raise ValueError(
                    f"secondary_models[{i}].arg {sm.arg} is outside engine.args "
                    f"(0..{len(self.engine.args) - 1})"
                )
        problem = placement_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    # -- derived facts -----------------------------------------------------------------------------

    def active_env(self) -> list[EnvVar]:
        """Variables passed to the engine, in recipe order."""
        return [e for e in self.env if e.active]

    def why_no_image(self) -> str:
        """Why a spec with no engine.image and no engine.build has none: the recipe's image that import left
        out (a ``not_taken`` entry under :data:`IMAGE_NOT_TAKEN`, with its reason), else a recipe run outside
        a container."""
        left = [n for n in self.not_taken if n.item.startswith(IMAGE_NOT_TAKEN)]
        return f"{left[0].item}: {left[0].why}" if left else "the recipe ran vLLM outside a container"

    @property
    def model_placeholder(self) -> str | None:
        """The placeholder token the model still is (``<MODEL>``: fill ``placeholders``), or None."""
        repo = self.model.repo
        return repo if repo is not None and PLACEHOLDER_RE.fullmatch(repo) else None

    def fill_problems(self) -> list[tuple[str, str]]:
        """Each placeholder still to fill, by the field that holds it, with what to write there."""
        out = []
        for tok in self.unfilled_placeholders():
            if tok == self.model_placeholder:
                out.append(
                    (
                        "model.repo",
                        f"is the placeholder {tok} (the recipe runs a model from a variable it never sets); "
                        f"set `placeholders: {{{tok!r}: OWNER/NAME}}` in the spec (the model's Hub repo id, "
                        "or the absolute directory of a checkpoint on disk)",
                    )
                )
            else:
                out.append(
                    (
                        "placeholders",
                        f"{tok!r} has no value; set `placeholders: {{{tok!r}: VALUE}}` in the spec "
                        "(it is used by the recipe's args, env or a mount's host path)",
                    )
                )
        return out

    def unfilled_placeholders(self) -> list[str]:
        """Placeholder tokens still used by an active value and without a user value."""
        used: set[str] = {self.model_placeholder} if self.model_placeholder else set()
        cluster = self.cluster.nodes if self.cluster else ()
        for text in [
            *self.engine.args,
            *(e.value for e in self.active_env()),
            *(n.address for n in cluster),
            *(a for n in cluster for a in n.args or ()),
            *(m.host for m in self.mounts),
        ]:
            used.update(PLACEHOLDER_RE.findall(text))
        return sorted(t for t in used if not self.placeholders.get(t))

    def fill(self, text: str) -> str:
        """Replace filled placeholder tokens in ``text``."""
        for token, value in self.placeholders.items():
            if value:
                text = text.replace(token, value)
        return text

    @property
    def shutdown_timeout(self) -> int | None:
        """vLLM's own ``--shutdown-timeout`` from the args, if set."""
        v = self.engine.flag_value("--shutdown-timeout")
        return None if v is None else ascii_int(v)


# -- I/O ---------------------------------------------------------------------------------------------

_HINTS = {
    "extra_forbidden": "unknown field; check the spelling against schema/deployment.schema.json",
    "missing": "required field; add it",
}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names (aliases where set) of the model found at ``loc`` below ``model``; [] when the path
    leads to no model (a dict of free keys, a scalar)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        if field is None:
            return []
        current = _model_in(field.annotation)
    return [f.alias or n for n, f in current.model_fields.items()] if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation (``X``, ``X | None``, ``tuple[X, ...]``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def problems_from(err: ValidationError, model: type[BaseModel] | None = None) -> list[tuple[str, str]]:
    """Turn a pydantic error into (field path, message with hint) pairs, all of them. ``model``: the model
    validated, so an unknown field gets the nearest known one ("did you mean")."""
    out = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        hint = _HINTS.get(e["type"])
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden" and model is not None and loc and isinstance(loc[-1], str):
            near = difflib.get_close_matches(loc[-1], _fields_at(model, loc[:-1]), n=1, cutoff=0.6)
            if near:
                hint = f"unknown field; did you mean {near[0]!r}?"
        out.append((_loc(loc), f"{msg} ({hint})" if hint else msg))
    return out


def from_data(data: Any, source: str = "<spec>") -> Deployment:
    """Validate plain data into a Deployment; every problem in one SpecError."""
    if not isinstance(data, dict):
        raise SpecError(source, [("(top level)", "must be a mapping (YAML object)")])
    nul = nul_paths(data)
    if nul:
        raise SpecError(
            source, [(p, "holds a NUL character, which no target can carry; remove it") for p in nul]
        )
    try:
        return Deployment.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, problems_from(err, Deployment)) from None


def to_data(spec: Deployment, defaults: bool = False) -> dict[str, Any]:
    """Plain data for YAML, defaults left out so the user's file stays short (``defaults``: spelled out)."""
    data: dict[str, Any] = json.loads(spec.model_dump_json(exclude_defaults=not defaults))
    for e, item in zip(spec.env, data.get("env", ()), strict=True):
        if e.opt_in:  # an opt-in's state is written out: `enabled: true` is the user's explicit choice
            item["enabled"] = e.enabled
    if spec.model.repo is None:
        # Written out although it is the default: `repo: null` tells the reader nothing is downloaded.
        data["model"] = {"repo": None, **data["model"]}
    data = {"version": SPEC_VERSION, **data}
    return data


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double quotes for anything YAML would fold or normalise (control chars, NEL, U+2028/9, BOM,
    # trailing blanks); literal blocks only for plain multi-line text.
    style: str | None = None
    if any(not (c.isprintable() or c == "\n") or c == "\ufeff" for c in value):
        style = '"'
    elif "\n" in value:
        plain_lines = all(line == line.strip(" \t") or not line.strip() for line in value.split("\n"))
        style = "|" if plain_lines and not value.startswith((" ", "\n")) else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump(spec: Deployment) -> str:
    """The spec as YAML text (stable key order, unicode kept)."""
    return yaml.dump(to_data(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def loads(text: str, source: str = "<spec>") -> Deployment:
    """Parse YAML text into a Deployment."""
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SpecError(source, [("(file)", f"holds a NUL character (line {line}); a spec is YAML text")])
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        raise SpecError(source, [("(file)", yaml_problem(err))]) from None
    except RecursionError:
        raise SpecError(source, [("(file)", f"is nested more than {MAX_DEPTH} levels deep")]) from None
    problem = tree_problem(data)
    if problem:
        raise SpecError(source, [("(file)", problem)])
    return from_data(data, source)


def load(path: Path) -> Deployment:
    """Read and validate ``deployments/NAME.yaml``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(str(path), [("(file)", f"cannot read: {err.strerror}")]) from None
    except UnicodeDecodeError as err:
        raise SpecError(
            str(path), [("(file)", f"not UTF-8 text (at byte {err.start}); save the spec as UTF-8")]
        ) from None
    spec = loads(text, str(path))
    if spec.name != path.stem:
        raise SpecError(
            str(path), [("name", f"is {spec.name!r} but the file is {path.name}; make them match")]
        )
    return spec


def json_schema() -> dict[str, Any]:
    """JSON Schema of the spec, for editors."""
    schema = Deployment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rigsmith deployment"
    return schema
