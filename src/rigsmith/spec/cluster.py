"""The ``cluster`` section: several nodes serving one model, each value a node's shell, ssh or NCCL reads
held to the exact shape that program takes."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from rigsmith.modeldir import not_its_own
from rigsmith.spec.fields import MAX_GPUS, Frozen, cdi_names

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
