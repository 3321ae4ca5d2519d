"""Multi-node recipes: several launch commands in one block that are one deployment's nodes (issue 15).

Recognised today: vLLM's data-parallel pair (or group) without Ray — the first command serves the API
(``--data-parallel-size N --data-parallel-address A``), every other one adds ``--headless
--data-parallel-start-rank K`` — all ``vllm serve`` of the same model word. The group becomes one spec with
``cluster.layout: data-parallel`` and one node per command; each node's argv is kept byte for byte in
``cluster.nodes[i].args`` and the addresses become placeholders the user fills. Any other set of commands
is still refused (the caller keeps its message). Pure.

Every node is given ``--data-parallel-address`` and ``--data-parallel-rpc-port`` from the cluster section
when rendered, so what the recipe writes there is the cluster's, not a value of its own: a placeholder the
recipe leaves there (``$MASTER_IP`` bash never set: ``<MASTER_IP>``) is the head's address, node 0's
placeholder, filled once; a placeholder RPC port is the cluster's ``dp_rpc_port``; a number written there
becomes ``dp_rpc_port``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from rigsmith import spec as specmod
from rigsmith.digits import ascii_digits

#: The flags a node's command may carry its rank facts in (vLLM's long names and short aliases).
_HEADLESS = "--headless"
_START = ("--data-parallel-start-rank", "-dpr")
_DP_SIZE = ("--data-parallel-size", "-dp")
_LOCAL = ("--data-parallel-size-local", "-dpl")
_ADDRESS = ("--data-parallel-address", "-dpa")
_RPC = ("--data-parallel-rpc-port", "-dpp")
#: cluster.dp_rpc_port when the spec does not set it.
DEFAULT_RPC_PORT: int = specmod.Cluster.model_fields["dp_rpc_port"].default


def _has(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(a.split("=", 1)[0] in names for a in args)


def _value(args: Sequence[str], names: Sequence[str]) -> str | None:
    found = None
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        if name in names:
            found = val if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def _token(value: str | None) -> str | None:
    """``value`` when it is one placeholder token (``<MASTER_IP>``), else None."""
    return value if value and specmod.PLACEHOLDER_RE.fullmatch(value) else None


def rpc_port(args: Sequence[Sequence[str]]) -> int:
    """The group's RPC port: the number the head's command gives, else cluster.dp_rpc_port's default."""
    given = specmod.ascii_int(_value(args[0], _RPC) or "")
    return given if given and given <= 65535 else DEFAULT_RPC_PORT


def port_token(args: Sequence[Sequence[str]]) -> str | None:
    """The placeholder the group's commands give as ``--data-parallel-rpc-port`` (the cluster supplies the
    port), or None."""
    return _token(_value(args[0], _RPC))


def supply_port(args: Sequence[str], token: str, port: int) -> list[str]:
    """``args`` with the placeholder RPC port ``token`` written as the cluster's ``port``."""
    return [a.replace(token, str(port)) for a in args]


def node_args(argvs: Sequence[Sequence[str]]) -> list[list[str]] | None:
    """The argv after ``vllm serve`` of every command, head first, when the commands are one
    data-parallel group; None when they are not (the caller refuses them as before)."""
    if len(argvs) < 2 or any(
        len(a) < 3 or PurePosixPath(a[0]).name != "vllm" or a[1] != "serve" for a in argvs
    ):
        return None
    args = [list(a[2:]) for a in argvs]
    head, rest = args[0], args[1:]
    if _has(head, (_HEADLESS,)) or not _has(head, _DP_SIZE) or not _has(head, _ADDRESS):
        return None
    for a in rest:
        if a[0] != head[0] or not _has(a, (_HEADLESS,)) or not _has(a, _START):
            return None
        if _value(a, _DP_SIZE) != _value(head, _DP_SIZE):
            return None
    return args


def cluster_data(args: Sequence[Sequence[str]], vendor: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """The spec's ``cluster`` section for a data-parallel group, its placeholder tokens and import notes.

    Each node gets ``--data-parallel-size-local`` GPUs (TP × PP each rank; 1 when the recipe leaves it out)
    as ``vendor=0..n-1``; its address is a placeholder until the user writes it (node 0's: the placeholder
    the head's ``--data-parallel-address`` is, when it is one). A placeholder RPC port in a node's args is
    written as the cluster's (:func:`supply_port`; the head's args, engine.args, are the caller's).
    """
    nodes: list[dict[str, Any]] = []
    tokens = []
    address = _value(args[0], _ADDRESS)
    head = _token(address) if specmod.ADDRESS_RE.match(address or "") else None
    port, port_tok = rpc_port(args), port_token(args)
    for i, a in enumerate(args):
        local = _value(a, _LOCAL)
        tp = _value(a, ("--tensor-parallel-size", "-tp")) or "1"
        pp = _value(a, ("--pipeline-parallel-size", "-pp")) or "1"
        ranks = int(local) if local and ascii_digits(local) else 1
        per_rank = (int(tp) if ascii_digits(tp) else 1) * (int(pp) if ascii_digits(pp) else 1)
        token = head if i == 0 and head else f"<node{i} address>"
        tokens.append(token)
        nodes.append(
            {
                "name": f"node{i}",
                "address": token,
                "cdi_devices": [f"{vendor}={g}" for g in range(ranks * per_rank)],
                **({"args": supply_port(a, port_tok, port) if port_tok else list(a)} if i else {}),
            }
        )
    notes = [
        f"{len(args)} commands, one per node: imported as cluster.layout data-parallel with nodes "
        f"{', '.join(str(n['name']) for n in nodes)} (the first serves the API, the others are --headless "
        "ranks); fill each node's address, and its interface for NCCL/Gloo",
        f"--data-parallel-address {address} and --data-parallel-rpc-port {_value(args[0], _RPC)} are set "
        "on every node from cluster.nodes[0].address and cluster.dp_rpc_port"
        + (
            f" (node0's address is {head}, the head's address the commands name: fill it once)"
            if head
            else ""
        ),
    ]
    data: dict[str, Any] = {"layout": "data-parallel", "nodes": nodes}
    if port != DEFAULT_RPC_PORT:
        data["dp_rpc_port"] = port
    return data, tokens, notes
