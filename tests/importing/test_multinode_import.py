"""Ray multi-node recipes (issue 15): published head + worker + serve commands import as one Ray-layout
spec, or are refused naming what is missing.

The published cases are data (data/multinode-commands.json, each with its source URL; expected outcomes
in multinode_expected.yaml). Where bash can run the text as its author meant it, bash is the argv oracle:
stub commands record every call, and the spec must hold the argv bash passed to each.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.importing import recipe
from rigsmith.rendering import cluster, deploy
from tests.support.common import require, write_project
from tests.support.recipes import refusal

HERE = Path(__file__).parent
CASES = json.loads((HERE / "data" / "multinode-commands.json").read_text(encoding="utf-8"))
EXPECTED: dict[str, Any] = yaml.safe_load((HERE / "multinode_expected.yaml").read_text(encoding="utf-8"))
IDS = [c["id"] for c in CASES]


def _import(case: dict[str, Any], text: str | None = None) -> specmod.Deployment:
    raw = case["raw"] if text is None else text
    image = EXPECTED.get(case["id"], {}).get("image")
    return recipe.parse(
        raw, source=case["source"], sha256=hashlib.sha256(raw.encode()).hexdigest(), image=image
    )


def test_expected_outcomes_cover_exactly_the_cases_and_each_names_its_source() -> None:
    assert sorted(EXPECTED) == sorted(IDS) and len(IDS) >= 3
    assert all(c["source"].startswith("https://") and c["raw"].strip() for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_published_multinode_case(case: dict[str, Any], tmp_path: Path) -> None:
    want = EXPECTED[case["id"]]
    if want["outcome"] == "refused":
        message = refusal(case["raw"], case["source"])
        assert all(fragment in message for fragment in want["reason"]), message
        return
    dep = _import(case)
    assert dep.cluster is not None and dep.cluster.layout == "ray"
    assert list(dep.engine.args) == want["args"]
    assert {e.name: e.value for e in dep.env} == want["env"]
    nodes = [
        {
            "address": n.address,
            **({"interface": n.interface} if n.interface else {}),
            "gpus": len(n.cdi_devices),
        }
        for n in dep.cluster.nodes
    ]
    assert nodes == want["nodes"]
    assert [[m.host, m.container] for m in dep.mounts] == want["mounts"]
    assert dep.resources.shm_size == want["shm_size"]
    # the nodes' addresses, and (issue 35) the variables the text never sets that reach the spec
    tokens = sorted(
        [n["address"] for n in want["nodes"] if n["address"].startswith("<")] + want.get("unset", [])
    )
    assert dep.unfilled_placeholders() == tokens
    notes = "\n".join(dep.notes)
    for fragment in want["notes_contain"]:
        assert fragment in notes
    # Filled in, the spec renders per node (or deploy names why not, with the field).
    data = specmod.to_data(dep)
    data["name"] = "mn"
    paths = {dep.model_placeholder, *(m.host for m in dep.mounts)}  # a model or a host directory: a path
    data["placeholders"] = {
        t: f"/srv/filled/{i}" if t in paths else f"10.9.0.{i + 1}" for i, t in enumerate(tokens)
    }
    project = write_project(tmp_path, data)
    if "deploy_refused" in want:
        with pytest.raises(SpecError) as serr:
            deploy.artifacts(project, "podman", deployment="mn")
        assert want["deploy_refused"] in str(serr.value)
    else:
        _, files = deploy.artifacts(project, "podman", deployment="mn")
        assert {a.path.parent.name for a in files if a.path.name == "run.sh"} == {"mn-node0", "mn-node1"}


_STUBS = """
set -f
_argv() { printf '%s\\0' "$@" >> "$ARGV_OUT"; printf '\\n' >> "$ARGV_OUT"; }
vllm() { _argv vllm "$@"; }
python3() { _argv python3 "$@"; }
docker() { _argv docker "$@"; }
bash() { _argv bash "$@"; }
./run_cluster.sh() { _argv ./run_cluster.sh "$@"; }
"""

_ORACLE = [
    c for c in CASES if EXPECTED[c["id"]]["outcome"] == "imported" and "oracle_skip" not in EXPECTED[c["id"]]
]


@pytest.mark.parametrize("case", _ORACLE, ids=[c["id"] for c in _ORACLE])
def test_imported_argv_is_what_bash_passes(case: dict[str, Any], tmp_path: Path) -> None:
    """Every node's run_cluster.sh call (image, head address, HF home) and the serve argv, as bash runs
    the published text, are what the spec holds."""
    out = tmp_path / "argv"
    env = {"PATH": os.environ["PATH"], "ARGV_OUT": str(out), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [require("bash"), "--noprofile", "--norc", "-c", _STUBS + case["raw"]],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = [c.split("\0") for c in out.read_bytes().decode().split("\0\n") if c]
    nodes = [c for c in calls if Path(c[0] if c[0] != "bash" else c[1]).name == "run_cluster.sh"]
    serve = [c for c in calls if c[0] in ("vllm", "python3")]
    dep = _import(case)
    assert dep.cluster is not None and len(nodes) == len(dep.cluster.nodes) and len(serve) == 1
    args = serve[0][2:] if serve[0][0] == "vllm" else serve[0][3:]
    added = [] if "--distributed-executor-backend" in args else ["--distributed-executor-backend", "ray"]
    assert list(dep.engine.args) == [*args, *added]
    for call in nodes:
        image, _head, role, hf_home = call[-4:] if len(call) == 5 else call[1:5]
        assert (image, role) == (dep.engine.image, role)
        assert hf_home in (dep.model.local_dir, *(m.host for m in dep.mounts))


def _run_cluster_text(serve: str, worker: bool = True, head: bool = True) -> str:
    """run_cluster.sh's own docker run (examples/online_serving/run_cluster.sh) with its values written in."""
    node = (
        "docker run --entrypoint /bin/bash --network host --name node-{n} --shm-size 10.24g --gpus all "
        "-v /srv/hf:/root/.cache/huggingface -e VLLM_HOST_IP={ip} -e NCCL_SOCKET_IFNAME=enp65s0 "
        '-e GLOO_SOCKET_IFNAME=enp65s0 -e NCCL_IB_DISABLE=1 vllm/vllm-openai:v0.11.0 -c "{ray}"\n'
    )
    text = ""
    if head:
        ray = "ray start --block --head --node-ip-address=10.0.0.1 --port=6380"
        text += node.format(n=1, ip="10.0.0.1", ray=ray)
    if worker:
        text += node.format(n=2, ip="10.0.0.2", ray="ray start --block --address=10.0.0.1:6380")
    return text + serve


def test_the_expanded_docker_run_form_imports_addresses_interfaces_and_the_ray_port(tmp_path: Path) -> None:
    serve = (
        "docker exec node-1 vllm serve org/model --tensor-parallel-size 4 --pipeline-parallel-size 2 "
        "--distributed-executor-backend ray\n"
    )
    case = {"id": "x", "source": "test"}
    dep = _import(case, _run_cluster_text(serve))
    assert dep.cluster is not None
    assert [(n.address, n.interface, len(n.cdi_devices)) for n in dep.cluster.nodes] == [
        ("10.0.0.1", "enp65s0", 4),
        ("10.0.0.2", "enp65s0", 4),
    ]
    assert dep.cluster.ray_port == 6380 and dep.engine.image == "vllm/vllm-openai:v0.11.0"
    assert {e.name: e.value for e in dep.env} == {"NCCL_IB_DISABLE": "1"}
    assert list(dep.engine.args) == [
        "org/model", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    assert not dep.placeholders and cluster.problems(dep) == []
    project = write_project(tmp_path, {**specmod.to_data(dep), "name": "ray2"})
    _, files = deploy.artifacts(project, "podman", deployment="ray2")
    head = next(a.content for a in files if a.path.parent.name == "ray2-node0" and a.path.name == "run.sh")
    assert "ray start --head --port=6380 --node-ip-address=10.0.0.1 --num-gpus=4" in head


def test_a_ray_nodes_unset_address_variable_is_its_address_filled_once(tmp_path: Path) -> None:
    """$HEAD_IP and $WORKER_IP, never set, are the nodes' addresses as placeholders of those names: the
    user fills each once and the head's scripts carry it."""
    serve = "docker exec node-1 vllm serve org/model -tp 4 -pp 2 --distributed-executor-backend ray\n"
    text = (
        _run_cluster_text(serve)
        .replace("VLLM_HOST_IP=10.0.0.1", "VLLM_HOST_IP=$HEAD_IP")
        .replace("VLLM_HOST_IP=10.0.0.2", "VLLM_HOST_IP=$WORKER_IP")
        .replace("10.0.0.1", "$HEAD_IP")
    )
    dep = _import({"id": "x", "source": "test"}, text)
    assert dep.cluster is not None
    assert [n.address for n in dep.cluster.nodes] == ["<HEAD_IP>", "<WORKER_IP>"]
    assert dep.unfilled_placeholders() == ["<HEAD_IP>", "<WORKER_IP>"]
    data = {**specmod.to_data(dep), "name": "ray2"}
    data["placeholders"] = {"<HEAD_IP>": "10.9.0.1", "<WORKER_IP>": "10.9.0.2"}
    _, files = deploy.artifacts(write_project(tmp_path, data), "podman", deployment="ray2")
    run = {a.path.parent.name: a.content for a in files if a.path.name == "run.sh"}
    assert "--node-ip-address=10.9.0.1" in run["ray2-node0"]
    assert "10.9.0.1:6380" in run["ray2-node1"] and "--node-ip-address=10.9.0.2" in run["ray2-node1"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (_run_cluster_text("vllm serve org/m -tp 4 -pp 2\n", worker=False), "no worker command is given"),
        (_run_cluster_text("vllm serve org/m -tp 4 -pp 2\n", head=False), "the head's command is not given"),
        (_run_cluster_text(""), "the serve command is not given"),
        (_run_cluster_text("vllm serve org/m -tp 8\nvllm serve org/m -tp 8\n"),
         "2 serve commands (lines 3, 4)"),
        (_run_cluster_text("vllm serve org/m -tp 8 --distributed-executor-backend mp\n"),
         "runs --distributed-executor-backend mp, so the Ray cluster"),
        (_run_cluster_text("vllm serve org/m -tp 8\n").replace("10.0.0.1:6380", "10.0.0.1:6379"),
         "the worker joins port 6379, but the head's Ray port is 6380"),
        # issue 35: a command outside the launchers (curl) is bash's and only noted; a launcher is judged
        (_run_cluster_text("vllm serve org/m -tp 8\ndocker ps\n"),
         "line 4: 'docker' is neither a node's ray start container nor the serve command"),
    ],
    ids=["no-worker", "no-head", "no-serve", "two-serves", "backend-mp", "port-mismatch", "stray-command"],
)  # fmt: skip
def test_an_incomplete_ray_block_is_refused_naming_what_is_missing(text: str, fragment: str) -> None:
    message = refusal(text)
    assert fragment in message
    assert message.count("\n  - ") == 1, "one problem: one paragraph"


def test_a_serve_command_typed_in_the_heads_shell_keeps_its_env_and_gpu_selection_becomes_each_nodes() -> (
    None
):
    text = _run_cluster_text(
        "docker exec -it node-1 bash\n"
        "VLLM_USE_V1=1 python3 -m vllm.entrypoints.openai.api_server --model org/model "
        "--tensor-parallel-size 2 --pipeline-parallel-size 2\n"
    ).replace("-e NCCL_IB_DISABLE=1", "-e CUDA_VISIBLE_DEVICES=2,3")
    dep = _import({"id": "x", "source": "test"}, text)
    assert dep.cluster is not None
    assert [list(n.cdi_devices) for n in dep.cluster.nodes] == [["nvidia.com/gpu=2", "nvidia.com/gpu=3"]] * 2
    assert {e.name: e.value for e in dep.env} == {"VLLM_USE_V1": "1"}
    assert dep.engine.executable == "python3" and dep.engine.args[-2:] == (
        "--distributed-executor-backend",
        "ray",
    )
    notes = "\n".join(dep.notes)
    assert "opens a shell in the head's container" in notes
    assert "CUDA_VISIBLE_DEVICES=2,3 selects GPUs on the head's host" in notes
    assert cluster.problems(dep) == []


_DP_PAIR = (
    "vllm serve org/m --data-parallel-size 4 --data-parallel-size-local 2 "
    "--data-parallel-address {addr} --data-parallel-rpc-port {port}\n"
    "vllm serve org/m --headless --data-parallel-start-rank 2 --data-parallel-size 4 "
    "--data-parallel-size-local 2 --data-parallel-address {addr} --data-parallel-rpc-port {port}\n"
)


@pytest.mark.parametrize(("port", "rpc_port"), [("$PORT", 13345), ("29550", 29550)])
def test_a_data_parallel_pairs_address_and_rpc_port_are_the_clusters(
    tmp_path: Path, port: str, rpc_port: int
) -> None:
    """What the commands give --data-parallel-address and --data-parallel-rpc-port is what every node gets
    from the cluster: the unset $MASTER_IP is node 0's address (one value to fill), an unset $PORT is
    cluster.dp_rpc_port and a written port becomes it; filled, every node runs with those values."""
    text = _DP_PAIR.format(addr="$MASTER_IP", port=port)
    dep = recipe.parse(text, source="t", sha256=hashlib.sha256(text.encode()).hexdigest(), name="dp")
    assert dep.cluster is not None and dep.cluster.layout == "data-parallel"
    assert [n.address for n in dep.cluster.nodes] == ["<MASTER_IP>", "<node1 address>"]
    assert dep.cluster.dp_rpc_port == rpc_port
    assert dep.unfilled_placeholders() == ["<MASTER_IP>", "<node1 address>"]
    for argv in (dep.engine.args, dep.cluster.nodes[1].args or ()):
        assert argv[list(argv).index("--data-parallel-rpc-port") + 1] == str(rpc_port)
    data = specmod.to_data(dep)
    data["placeholders"] = {"<MASTER_IP>": "10.9.0.1", "<node1 address>": "10.9.0.2"}
    data["engine"]["image"] = "localhost/vllm:1"  # the commands run vLLM from a venv
    _, files = deploy.artifacts(write_project(tmp_path, data), "podman", deployment="dp")
    scripts = {a.path.parent.name: a.content for a in files if a.path.name == "run.sh"}
    assert set(scripts) == {"dp-node0", "dp-node1"}
    for script in scripts.values():
        assert "--data-parallel-address 10.9.0.1" in script
        assert f"--data-parallel-rpc-port {rpc_port}" in script and "<" + "PORT>" not in script
