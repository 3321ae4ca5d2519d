"""Multi-node test deployments: seed 003 (TP2 × PP2) as a two-node Ray cluster, and the corpus' Kimi-K2
data-parallel pair as imported, addresses filled."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import yaml

from rigsmith import spec as specmod
from rigsmith.importing import recipe
from tests.support.common import REPO

RAY_NAME = "merlin-2x2-ray"
DP_NAME = "kimi-k2-dp-2node"
#: Addresses of the test's own network namespaces (tests/rendering/test_cluster_ray.py creates them).
HEAD_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"


def ray_data(
    seed: dict[str, Any] | None = None, name: str = RAY_NAME, interface: str = "enp65s0"
) -> dict[str, Any]:
    """Seed 003's deployment (``seed``: that data already re-pointed, e.g. by standin_deployment) as two
    nodes of two GPUs joined by Ray."""
    data = (
        copy.deepcopy(seed)
        if seed is not None
        else yaml.safe_load((REPO / "deployments" / "flash-next-merlin-4x3090.yaml").read_text())
    )
    data["name"] = name
    # The seed picks 4 GPUs of one host with CUDA_VISIBLE_DEVICES; here each node's cdi_devices pick them.
    data["env"] = [e for e in data["env"] if e["name"] != "CUDA_VISIBLE_DEVICES"]
    data["engine"]["args"] = [*data["engine"]["args"], "--distributed-executor-backend", "ray"]
    vendor = data["resources"]["gpus"]["cdi_devices"][0].split("=", 1)[0]
    data["cluster"] = {
        "layout": "ray",
        "nodes": [
            {"name": "box-a", "address": HEAD_IP, "interface": interface,
             "cdi_devices": [f"{vendor}=0", f"{vendor}=1"]},
            {"name": "box-b", "address": WORKER_IP, "interface": interface,
             "cdi_devices": [f"{vendor}=0", f"{vendor}=1"]},
        ],
        "join_timeout_seconds": 120,
    }  # fmt: skip
    return data


def dp_data() -> dict[str, Any]:
    """The corpus' two-node data-parallel Kimi-K2 recipe as import-recipe writes it, then filled."""
    cases = json.loads((REPO / "tests/importing/data/vllm-commands.json").read_text())
    items = cases if isinstance(cases, list) else cases["commands"]
    case = next(c for c in items if c["id"] == "recipes-kimi-k2-dp16-ep-two-node-headless")
    raw = case["raw"]
    dep = recipe.parse(
        raw, source=case["source"], sha256=hashlib.sha256(raw.encode()).hexdigest(), name=DP_NAME
    )
    data = specmod.to_data(dep)
    data["engine"]["image"] = "localhost/vllm:1"
    data["placeholders"] = {"<node0 address>": "192.168.50.11", "<node1 address>": "192.168.50.12"}
    data["resources"]["host_ram_gib"] = 1024  # the lxc target sizes each CT from it
    for node in data["cluster"]["nodes"]:
        node["interface"] = "enp65s0"
    return data
