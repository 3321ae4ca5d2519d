"""Multi-node recipes: several launch commands in one block that are one deployment's nodes (issue 15).

Recognised today: vLLM's data-parallel pair (or group) without Ray — the first command serves the API
(``--data-parallel-size N --data-parallel-address A``), every other one adds ``--headless
--data-parallel-start-rank K`` — all ``vllm serve`` of the same model word. The group becomes one spec with
``cluster.layout: data-parallel`` and one node per command; each node's argv is kept byte for byte in
``cluster.nodes[i].args`` and the addresses become placeholders the user fills. Any other set of commands
is still refused (the caller keeps its message). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

#: The flags a node's command may carry its rank facts in (vLLM's long names and short aliases).
_HEADLESS = "--headless"
_START = ("--data-parallel-start-rank", "-dpr")
_DP_SIZE = ("--data-parallel-size", "-dp")
_LOCAL = ("--data-parallel-size-local", "-dpl")
_ADDRESS = ("--data-parallel-address", "-dpa")
_RPC = ("--data-parallel-rpc-port", "-dpp")


def _has(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(a.split("=", 1)[0] in names for a in args)


def _value(args: Sequence[str], names: Sequence[str]) -> str | None:
    found = None
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        if name in names:
            found = val if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


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
    as ``vendor=0..n-1``; its address is a placeholder until the user writes it.
    """
    nodes: list[dict[str, Any]] = []
    tokens = []
    for i, a in enumerate(args):
        local = _value(a, _LOCAL)
        tp = _value(a, ("--tensor-parallel-size", "-tp")) or "1"
        pp = _value(a, ("--pipeline-parallel-size", "-pp")) or "1"
        ranks = int(local) if local and local.isascii() and local.isdigit() else 1
        per_rank = (int(tp) if tp.isascii() and tp.isdigit() else 1) * (
            int(pp) if pp.isascii() and pp.isdigit() else 1
        )
        token = f"<node{i} address>"
        tokens.append(token)
        nodes.append(
            {
                "name": f"node{i}",
                "address": token,
                "cdi_devices": [f"{vendor}={g}" for g in range(ranks * per_rank)],
                **({"args": list(a)} if i else {}),
            }
        )
    notes = [
        f"{len(args)} commands, one per node: imported as cluster.layout data-parallel with nodes "
        f"{', '.join(str(n['name']) for n in nodes)} (the first serves the API, the others are --headless "
        "ranks); fill each node's address, and its interface for NCCL/Gloo",
        f"--data-parallel-address {_value(args[0], _ADDRESS)} and --data-parallel-rpc-port "
        f"{_value(args[0], _RPC)} are set on every node from cluster.nodes[0].address and "
        "cluster.dp_rpc_port",
    ]
    return {"layout": "data-parallel", "nodes": nodes}, tokens, notes
