"""Multi-node deployments (issue 15): per-node artifacts for every target, validation, LeaderWorkerSet.

Golden files: tests/golden/cluster/<deployment>/<target>/ for seed 003 as a two-node Ray cluster and for the
corpus' two-node data-parallel Kimi-K2 recipe as imported. Refresh with --update-golden.
"""

from __future__ import annotations

import copy
import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rigsmith.errors import SpecError
from rigsmith.project import Project
from rigsmith.rendering import cluster, deploy
from tests.rendering.test_units import _k8s_expand
from tests.support import cluster as fixtures
from tests.support.common import GOLDEN, compare_tree, golden_files, write_project
from tests.support.targets import render_seed

DATA = Path(__file__).parent / "data"
NODE_TARGETS = ("podman", "quadlet", "compose", "lxc")


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return write_project(tmp_path, fixtures.ray_data(), fixtures.dp_data())


@pytest.mark.parametrize("target", [*NODE_TARGETS, "kube"])
def test_ray_cluster_artifacts_match_golden_files(
    project: Project, tmp_path: Path, update_golden: bool, target: str
) -> None:
    files = render_seed(project, target, fixtures.RAY_NAME, tmp_path / "out")
    compare_tree(files, GOLDEN / "cluster" / fixtures.RAY_NAME / target, update_golden)


@pytest.mark.parametrize("target", [*NODE_TARGETS, "kube"])
def test_imported_data_parallel_pair_artifacts_match_golden_files(
    project: Project, tmp_path: Path, update_golden: bool, target: str
) -> None:
    files = render_seed(project, target, fixtures.DP_NAME, tmp_path / "out")
    compare_tree(files, GOLDEN / "cluster" / fixtures.DP_NAME / target, update_golden)


@pytest.mark.parametrize(
    "script",
    golden_files("cluster/*/*/*/*.sh"),
    ids=lambda p: "/".join(p.parts[-4:]),
)
def test_node_scripts_are_shellcheck_clean(script: Path) -> None:
    import subprocess

    from tests.support.common import require

    proc = subprocess.run(
        [require("shellcheck"), "--severity=style", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def _run_argv(run_sh: str) -> list[str]:
    """The words of run.sh's ``podman run`` command, as a shell would split them (``$IMAGE`` kept)."""
    start = run_sh.index("\npodman run")
    end = run_sh.index("\necho ", start)
    return shlex.split(run_sh[start:end].replace("\\\n", " ").replace('"$IMAGE"', "IMAGE"))


def test_every_node_container_gets_its_devices_env_shm_memlock_and_grace(
    project: Project, tmp_path: Path
) -> None:
    files = render_seed(project, "podman", fixtures.RAY_NAME, tmp_path / "out")
    for node, ip, role in (("box-a", fixtures.HEAD_IP, "head"), ("box-b", fixtures.WORKER_IP, "worker")):
        argv = _run_argv(files[f"{fixtures.RAY_NAME}-{node}/run.sh"])
        opts = argv[: argv.index("IMAGE")]
        pairs = list(itertools.pairwise(opts))
        assert [v for k, v in pairs if k == "--device"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
        envs = [v for k, v in pairs if k == "--env"]
        assert f"VLLM_HOST_IP={ip}" in envs
        assert {"NCCL_SOCKET_IFNAME=enp65s0", "GLOO_SOCKET_IFNAME=enp65s0"} <= set(envs)
        assert ("--shm-size", "8g") in pairs and ("--ulimit", "memlock=-1:-1") in pairs
        assert ("--stop-timeout", "70") in pairs and ("--label", f"io.rigsmith.role={role}") in pairs
        script = argv[argv.index("IMAGE") + 2]
        assert argv[argv.index("IMAGE") + 1] == "-c" and ("--entrypoint", "bash") in pairs
        if role == "head":
            assert script.startswith(f"ray start --head --port=6379 --node-ip-address={ip} --num-gpus=2 ")
            # The engine starts only after the wait for 2 nodes and 4 GPUs, with the recipe's argv intact.
            wait, engine = script.split(" && exec ", 1)
            assert shlex.split(wait)[-3:] == ["2", "4", "60"]
            spec = project.load(fixtures.RAY_NAME)
            assert shlex.split(engine) == ["vllm", *spec.engine.container_argv(spec.model)]
        else:
            join = (
                f"; ray start --block --address={fixtures.HEAD_IP}:6379 --node-ip-address={ip} "
                "--num-gpus=2 --disable-usage-stats & exec python3 -c "
            )
            assert join in script and script.endswith(" $! 8000 /health")


def test_data_parallel_ranks_get_their_rank_flags_and_the_first_nodes_address(
    project: Project, tmp_path: Path
) -> None:
    files = render_seed(project, "podman", fixtures.DP_NAME, tmp_path / "out")
    argvs = [_run_argv(files[f"{fixtures.DP_NAME}-node{i}/run.sh"]) for i in (0, 1)]
    cmds = [a[a.index("IMAGE") + 1 :] for a in argvs]
    # The headless rank runs under the health responder: `bash -c 'vllm serve … & exec python3 …'`.
    assert argvs[1][argvs[1].index("--entrypoint") + 1] == "bash" and cmds[1][0] == "-c"
    words = shlex.split(cmds[1][1])
    cmds[1] = words[1 : words.index("&")]
    assert words[0] == "vllm" and words[-3:] == ["$!", "8000", "/health"]

    def value(cmd: list[str], flag: str) -> str | None:
        return cmd[cmd.index(flag) + 1] if flag in cmd else None

    for cmd in cmds:
        assert cmd[:2] == ["serve", "/models/Kimi-K2-Instruct"]
        assert value(cmd, "--data-parallel-address") == "192.168.50.11"
        assert value(cmd, "--data-parallel-rpc-port") == "13345"
        assert value(cmd, "--data-parallel-size") == "16" and value(cmd, "--data-parallel-size-local") == "8"
    assert "--headless" not in cmds[0] and value(cmds[0], "--data-parallel-start-rank") is None
    # Node 1 keeps the recipe's own second command, word order included.
    assert cmds[1][2:5] == ["--headless", "--data-parallel-start-rank", "8"]


def _spec(data: dict[str, Any]) -> Any:
    from rigsmith import spec as specmod

    return specmod.from_data(data)


def test_cluster_problems_are_all_reported_with_field_paths() -> None:
    data = fixtures.ray_data()
    data["engine"]["args"] = [
        a for a in data["engine"]["args"] if a not in ("--distributed-executor-backend", "ray")
    ]
    data["env"].append({"name": "VLLM_HOST_IP", "value": "1.2.3.4"})
    data["env"].append({"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"})
    data["cluster"]["nodes"][1]["name"] = "box-a"
    data["cluster"]["nodes"][1]["cdi_devices"] = ["nvidia.com/gpu=0"]
    data["cluster"]["ray_port"] = 8000
    with pytest.raises(SpecError) as err:
        cluster.check(_spec(data), "deployments/x.yaml")
    fields = [f for f, _ in err.value.problems]
    assert fields == [
        "cluster.nodes[1].name",
        f"env[{len(data['env']) - 2}]",
        f"env[{len(data['env']) - 1}]",
        "cluster.ray_port",
        "cluster.nodes",
        "engine.args",
    ]
    text = str(err.value)
    assert "the nodes give 3 GPUs but TP 2 × PP 2 × DP 1 = 4" in text
    assert "--distributed-executor-backend ray" in text and "Traceback" not in text


@pytest.mark.parametrize(
    ("layout_data", "field", "port", "flagged", "other"),
    [
        (fixtures.ray_data, "network.port", 10001, "network.port", "Ray's client server"),
        (fixtures.ray_data, "cluster.ray_port", 10001, "cluster.ray_port", "Ray's client server"),
        (fixtures.dp_data, "cluster.dp_rpc_port", 8000, "cluster.dp_rpc_port", "the API server"),
    ],
)
def test_the_heads_ports_may_not_collide(
    layout_data: Any, field: str, port: int, flagged: str, other: str
) -> None:
    """The API port, Ray's GCS port, Ray's client server and the data-parallel RPC port all listen on the
    head: two of them on one port is reported on the field to change, without a host."""
    data = layout_data()
    section, key = field.split(".")
    data.setdefault(section, {})[key] = port
    found = cluster.port_problems(_spec(data))
    assert [f for f, _ in found] == [flagged]
    assert f"is {port}, which {other}" in found[0][1]
    assert cluster.port_problems(_spec(layout_data())) == []


def test_data_parallel_problems_name_the_node() -> None:
    data = fixtures.dp_data()
    data["cluster"]["nodes"][1]["args"] = [
        a for a in data["cluster"]["nodes"][1]["args"] if a != "--headless"
    ]
    data["cluster"]["nodes"][1]["args"][2] = "4"  # --data-parallel-start-rank 4, node 0 has 8 ranks
    with pytest.raises(SpecError) as err:
        cluster.check(_spec(data), "deployments/x.yaml")
    assert [f for f, _ in err.value.problems] == ["cluster.nodes[1].args", "cluster.nodes[1].args"]
    assert "--data-parallel-start-rank is 4 but node1's GPUs give 8" in str(err.value)
    assert "add --headless" in str(err.value)


def test_spec_rejects_malformed_nodes_with_paths() -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][0]["interface"] = "eth0; reboot"
    data["cluster"]["nodes"][1]["address"] = "10.0.0.1 --x"
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:2]
    with pytest.raises(SpecError) as err:
        _spec(data)
    assert [f for f, _ in err.value.problems] == ["cluster.nodes[0].interface", "cluster.nodes[1].address"]


def test_single_node_spec_dumps_without_a_cluster_key() -> None:
    from rigsmith import spec as specmod

    seed = yaml.safe_load((fixtures.REPO / "deployments/flash-next-merlin-4x3090.yaml").read_text())
    assert "cluster" not in specmod.to_data(_spec(seed))
    two = _spec(fixtures.ray_data())
    assert specmod.loads(specmod.dump(two)) == two


def test_deploy_refuses_unfilled_node_addresses(tmp_path: Path) -> None:
    data = fixtures.dp_data()
    data["placeholders"] = {t: None for t in data["placeholders"]}
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "podman", deployment=fixtures.DP_NAME)
    # node 0's address is the placeholder the recipe gives --data-parallel-address ($MASTER_IP, never set)
    assert [n["address"] for n in data["cluster"]["nodes"]] == ["<MASTER_IP>", "<node1 address>"]
    assert "'<MASTER_IP>' has no value" in str(err.value)
    assert "'<node1 address>' has no value" in str(err.value)


# -- Kubernetes: LeaderWorkerSet ------------------------------------------------------------------


def _closed(schema: Any) -> Any:
    """The schema with every object closed to the CRD's own fields (an unknown field would be pruned by
    the API server without a word, so the test treats one as an error)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _lws_docs(project: Project, tmp_path: Path) -> list[dict[str, Any]]:
    files = render_seed(project, "kube", fixtures.RAY_NAME, tmp_path / "out")
    return list(yaml.safe_load_all(files[f"{fixtures.RAY_NAME}.yaml"]))


def test_leaderworkerset_matches_the_crd_schema(project: Project, tmp_path: Path) -> None:
    lws, service = _lws_docs(project, tmp_path)
    schema = _closed(yaml.safe_load((DATA / "lws-crd-v1-excerpt.yaml").read_text()))
    jsonschema.validate(lws, schema)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # The excerpt schema is strict enough to fail: a misspelt LWS field or a bad restart policy.
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroupOnRestart"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_leaderworkerset_pod_templates_are_valid_core_v1_pod_templates(
    project: Project, tmp_path: Path
) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    lws, _ = _lws_docs(project, tmp_path)
    for role in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][role]
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": pod}
        kv.validate(doc, "1.30", strict=True)


def test_leaderworkerset_leader_runs_the_head_and_workers_join_the_leader_address(
    project: Project, tmp_path: Path
) -> None:
    lws, _ = _lws_docs(project, tmp_path)
    t = lws["spec"]["leaderWorkerTemplate"]
    leader = t["leaderTemplate"]["spec"]["containers"][0]
    worker = t["workerTemplate"]["spec"]["containers"][0]
    for c in (leader, worker):
        assert c["env"][0] == {
            "name": "VLLM_HOST_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        }
        assert c["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    # Kubernetes turns $$ into $: the scripts reach bash with one $ (their $(…) stay shell).
    head = _k8s_expand(leader["args"][1], {})
    assert head.startswith('ray start --head --port=6379 --node-ip-address="$VLLM_HOST_IP" ')
    assert (
        ' "$LWS_GROUP_SIZE" "$((LWS_GROUP_SIZE * 2))" 60 && exec vllm serve /models/Flash-Next-Merlin '
        in head
    )
    script = _k8s_expand(worker["args"][1], {})
    assert '--address="$LWS_LEADER_ADDRESS":6379' in script and "$(seq 60)" in script
    assert worker["readinessProbe"] == leader["readinessProbe"]  # the worker's responder answers it
    assert not re.search(r"10\.231\.", yaml.safe_dump(lws)), "LWS pods learn addresses from the cluster"


def test_data_parallel_leaderworkerset_is_valid_and_ranks_follow_the_pod_index(
    project: Project, tmp_path: Path
) -> None:
    """The DP pair as one LeaderWorkerSet: the CRD schema (closed), core/v1 pod templates, rank 0 on the
    leader, every worker --headless from rank LWS_WORKER_INDEX × its local ranks."""
    kv = pytest.importorskip("kubernetes_validate")
    files = render_seed(project, "kube", fixtures.DP_NAME, tmp_path / "out")
    lws, service = yaml.safe_load_all(files[f"{fixtures.DP_NAME}.yaml"])
    jsonschema.validate(lws, _closed(yaml.safe_load((DATA / "lws-crd-v1-excerpt.yaml").read_text())))
    t = lws["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role in ("leaderTemplate", "workerTemplate"):
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": t[role]}
        kv.validate(doc, "1.30", strict=True)
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    leader = t["leaderTemplate"]["spec"]["containers"][0]
    worker = t["workerTemplate"]["spec"]["containers"][0]
    head = shlex.split(_k8s_expand(leader["args"][1], {}))
    assert head[:3] == ["exec", "vllm", "serve"] and "--headless" not in head
    assert cluster.flag_value(head, "--data-parallel-address") == "$VLLM_HOST_IP"
    assert cluster.flag_value(head, "--data-parallel-size-local") == "8"
    assert cluster.flag_value(head, "--data-parallel-rpc-port") == "13345"
    rank = shlex.split(_k8s_expand(worker["args"][1], {}).split(" & exec ")[0])
    assert rank[:2] == ["vllm", "serve"] and "--headless" in rank
    assert cluster.flag_value(rank, "--data-parallel-address") == "$LWS_LEADER_ADDRESS"
    assert cluster.flag_value(rank, "--data-parallel-start-rank") == "$((LWS_WORKER_INDEX * 8))"
    assert worker["readinessProbe"] == leader["readinessProbe"]  # the rank's responder answers it
    assert "192.168.50." not in yaml.safe_dump(lws), "LWS pods learn addresses from the cluster"


def test_data_parallel_leaderworkerset_scripts_run_in_bash_with_the_pods_variables(tmp_path: Path) -> None:
    """Kubernetes hands each script to bash: the leader execs rank 0 with its pod address, a worker of
    index 2 (a group of 3) runs --headless from rank 16 against the leader's address (stubs record argv)."""

    project = write_project(tmp_path, fixtures.dp_data())
    lws, _ = yaml.safe_load_all(
        render_seed(project, "kube", fixtures.DP_NAME, tmp_path / "o")[f"{fixtures.DP_NAME}.yaml"]
    )
    pod_env = {"LWS_WORKER_INDEX": "2", "VLLM_HOST_IP": "127.0.0.9", "LWS_LEADER_ADDRESS": "127.0.0.1"}
    calls = _run_pods(lws, ("python3", "vllm"), pod_env, tmp_path, background="vllm")
    leader, worker = calls["leaderTemplate"]["vllm"], calls["workerTemplate"]["vllm"]
    assert cluster.flag_value(leader, "--data-parallel-address") == "127.0.0.9"
    assert cluster.flag_value(worker, "--data-parallel-address") == "127.0.0.1"
    assert cluster.flag_value(worker, "--data-parallel-start-rank") == "16"
    assert "--headless" in worker and "--headless" not in leader
    spec = project.load(fixtures.DP_NAME)
    assert leader[1] == worker[1] == spec.engine.container_argv(spec.model)[1]


def test_kube_refuses_data_parallel_workers_that_differ(project: Project, tmp_path: Path) -> None:
    data = fixtures.dp_data()
    nodes = data["cluster"]["nodes"]
    nodes.append({**copy.deepcopy(nodes[1]), "name": "node2", "address": "<node2 address>"})
    nodes[2]["args"] = cluster.set_flag(nodes[2]["args"], "--max-num-seqs", "128")
    nodes[2]["args"] = cluster.set_flag(nodes[2]["args"], "--data-parallel-start-rank", "16")
    for a in (nodes[0].get("args"), *(n["args"] for n in nodes[1:])):
        if a:
            a[a.index("--data-parallel-size") + 1] = "24"
    data["engine"]["args"][data["engine"]["args"].index("--data-parallel-size") + 1] = "24"
    data["placeholders"]["<node2 address>"] = "192.168.50.13"
    project = write_project(tmp_path / "p", data)
    with pytest.raises(SpecError) as err:
        render_seed(project, "kube", fixtures.DP_NAME, tmp_path / "out")
    assert [f for f, _ in err.value.problems] == ["cluster.nodes[2].args"]
    assert "LeaderWorkerSet workers share one command" in str(err.value)


def test_deploy_writes_every_nodes_files_and_says_where_each_runs(project: Project, tmp_path: Path) -> None:
    said: list[str] = []
    deploy.deploy(
        project, "podman", deployment=fixtures.RAY_NAME, out=tmp_path / "o", yes=True, echo=said.append
    )
    for node in ("box-a", "box-b"):
        assert (tmp_path / "o" / "podman" / f"{fixtures.RAY_NAME}-{node}" / "run.sh").is_file()
    steps = [line for line in said if line.startswith("on ")]
    assert steps[0].startswith(f"on box-a ({fixtures.HEAD_IP}, head): start: ")
    assert steps[0].endswith(f"podman/{fixtures.RAY_NAME}-box-a/run.sh")
    assert steps[1].startswith(f"on box-b ({fixtures.WORKER_IP}, worker): ")
    assert said[-1] == f"stop the head ({fixtures.RAY_NAME}-box-a) first, then {fixtures.RAY_NAME}-box-b"


def test_import_still_refuses_commands_that_are_not_one_node_group() -> None:
    from rigsmith.errors import RecipeError
    from rigsmith.importing import recipe

    # Node 1 serves another model: not one deployment's ranks.
    text = (
        "vllm serve org/a --data-parallel-size 2 --data-parallel-address 10.0.0.1\n"
        "vllm serve org/b --headless --data-parallel-start-rank 1 --data-parallel-size 2\n"
    )
    with pytest.raises(RecipeError) as err:
        recipe.parse(text, source="x", sha256="0" * 64)
    assert "2 commands in one block" in str(err.value)


STUB = '#!/bin/sh\nprintf "%s\\0" "$@" > "$OUT/$(basename "$0")"\n'


def _run_pods(
    lws: dict[str, Any], tools: tuple[str, ...], pod_env: dict[str, str], tmp_path: Path, background: str
) -> dict[str, dict[str, list[str]]]:
    """Each LWS pod's command and args as Kubernetes hands them to bash, with stub ``tools`` recording
    their argv (by role, then tool); waits (bounded) for ``background``, which a script starts with &."""
    import subprocess
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    calls = {}
    for role in ("leaderTemplate", "workerTemplate"):
        c = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
        out = tmp_path / role
        out.mkdir()
        argv = [_k8s_expand(a, pod_env) for a in [*c["command"], *c["args"]]]
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), **pod_env}
        subprocess.run(argv, env=env, check=True, timeout=30)
        for _ in range(50):
            if (out / background).exists():
                break
            time.sleep(0.1)
        calls[role] = {f.name: f.read_bytes().decode().split("\0")[:-1] for f in out.iterdir()}
    return calls


def test_leaderworkerset_scripts_run_in_bash_with_the_pods_variables(tmp_path: Path) -> None:
    """The leader's and a worker's script, as Kubernetes hands them to bash, call ray, the wait and vllm
    with the pod's own address, the group size and the leader's address (stubs record each call)."""
    import socket

    data = fixtures.ray_data()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    data["cluster"]["ray_port"] = port = listener.getsockname()[1]
    project = write_project(tmp_path, data)
    lws, _ = yaml.safe_load_all(
        render_seed(project, "kube", fixtures.RAY_NAME, tmp_path / "o")[f"{fixtures.RAY_NAME}.yaml"]
    )
    pod_env = {"LWS_GROUP_SIZE": "3", "VLLM_HOST_IP": "127.0.0.9", "LWS_LEADER_ADDRESS": "127.0.0.1"}
    try:
        calls = _run_pods(lws, ("ray", "python3", "vllm"), pod_env, tmp_path, background="ray")
    finally:
        listener.close()
    leader, worker = calls["leaderTemplate"], calls["workerTemplate"]
    assert leader["ray"] == [
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.9",
        "--num-gpus=2",
        "--disable-usage-stats",
    ]
    assert leader["python3"][0] == "-c" and leader["python3"][2:] == ["3", "6", "60"]
    spec = project.load(fixtures.RAY_NAME)
    assert leader["vllm"] == list(spec.engine.container_argv(spec.model))
    # The worker's main process is the health responder: ray's pid, the API port and the health path.
    assert worker.pop("python3")[3:] == ["8000", "/health"]
    assert worker == {
        "ray": [
            "start",
            "--block",
            f"--address=127.0.0.1:{port}",
            "--node-ip-address=127.0.0.9",
            "--num-gpus=2",
            "--disable-usage-stats",
        ]
    }


def test_quadlet_reads_every_node_unit_and_execstart_is_that_nodes_podman_argv(
    project: Project, quadlet_bin: Path, tmp_path: Path
) -> None:
    from rigsmith.rendering import plan as planmod
    from rigsmith.resolving.lock import lock as lockmod
    from tests.support.facts import exec_start, plan_facts, podman_facts, split_systemd
    from tests.support.targets import run_quadlet

    spec = project.load(fixtures.RAY_NAME)
    base = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml")
    files = render_seed(project, "quadlet", fixtures.RAY_NAME, tmp_path / "out")
    for node in cluster.node_plans(spec, base):
        unit = tmp_path / "units" / f"{node.plan.name}.container"
        unit.parent.mkdir(exist_ok=True)
        unit.write_text(files[unit.name])
        proc = run_quadlet(quadlet_bin, unit, tmp_path / node.node.name)
        assert proc.returncode == 0 and "unsupported key" not in proc.stderr, proc.stderr
        got = podman_facts(split_systemd(exec_start(proc.stdout)))
        want = plan_facts(node.plan)
        assert sorted(got.devices) == sorted(want.devices) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
        assert got.env == want.env and got.env["VLLM_HOST_IP"] == node.node.address
        assert (
            (got.entrypoint, got.command)
            == (want.entrypoint, want.command)
            == ("bash", list(node.plan.command))
        )
        assert got.shm == want.shm and got.memlock == want.memlock and got.stop_timeout == want.stop_timeout


def test_lxc_refuses_one_users_pct_conf_for_several_nodes(project: Project, tmp_path: Path) -> None:
    from rigsmith.errors import RigsmithError
    from rigsmith.rendering.targets import LxcOptions

    conf = tmp_path / "100.conf"
    conf.write_text("arch: amd64\n")
    with pytest.raises(RigsmithError) as err:
        deploy.artifacts(project, "lxc", deployment=fixtures.RAY_NAME, lxc=LxcOptions(config=conf))
    assert "2 nodes, one CT each" in err.value.message and err.value.hint


def test_data_parallel_nodes_without_their_own_argv_get_rank_flags_from_their_gpus(tmp_path: Path) -> None:
    from rigsmith import spec as specmod
    from rigsmith.rendering import plan as planmod
    from rigsmith.resolving.lock import lock as lockmod

    data = fixtures.dp_data()
    del data["cluster"]["nodes"][1]["args"]
    # Three nodes: 8 + 4 + 4 GPUs, TP 1: ranks 0-7, 8-11, 12-15.
    data["cluster"]["nodes"][1]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]
    data["cluster"]["nodes"].append(
        {**data["cluster"]["nodes"][1], "name": "node2", "address": "192.168.50.13"}
    )
    spec = specmod.from_data(data)
    base = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml")
    cmds = [n.plan.command for n in cluster.node_plans(spec, base)]
    cmds[1:] = [tuple(shlex.split(c[1])[1 : shlex.split(c[1]).index("&")]) for c in cmds[1:]]
    # Node 0 runs engine.args with only the address and RPC port set from the cluster.
    want = list(base.command)
    want[want.index("--data-parallel-address") + 1] = "192.168.50.11"
    want[want.index("--data-parallel-rpc-port") + 1] = "13345"
    assert list(cmds[0]) == want
    for cmd, local, start in ((cmds[1], "4", "8"), (cmds[2], "4", "12")):
        tail = ["--data-parallel-start-rank", start, "--headless"]
        assert list(cmd[-3:]) == tail
        assert cmd[cmd.index("--data-parallel-size-local") + 1] == local
        assert cmd[cmd.index("--data-parallel-address") + 1] == "192.168.50.11"


def test_a_headless_rank_answers_health_while_it_runs_and_forwards_sigterm(tmp_path: Path) -> None:
    """The responder a node without an API runs under: real bash and python3, a stand-in vllm that traps
    SIGTERM and exits 7 (what a draining engine would report)."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from rigsmith import spec as specmod
    from rigsmith.rendering import plan as planmod
    from rigsmith.resolving.lock import lock as lockmod

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = fixtures.dp_data()
    data["network"] = {"port": port}
    spec = specmod.from_data(data)
    node = cluster.node_plans(spec, planmod.make(spec, lockmod.Lock(), spec_path="x"))[1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "vllm").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@" > "$OUT/argv"\n'
        "trap 'echo TERM > \"$OUT/signal\"; exit 7' TERM\nwhile :; do sleep 0.1; done\n"
    )
    (bin_dir / "vllm").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path)}
    proc = subprocess.Popen([node.plan.entrypoint, *node.plan.command], env=env)
    try:
        url = f"http://127.0.0.1:{port}/health"
        status = 0
        for _ in range(100):
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    status = resp.status
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert (tmp_path / "signal").read_text() == "TERM\n"
    assert (tmp_path / "argv").read_text().splitlines()[:4] == [
        "serve", "/models/Kimi-K2-Instruct", "--headless", "--data-parallel-start-rank"
    ]  # fmt: skip


@pytest.mark.parametrize("value", ["10.0.0.2; touch /tmp/x", "-oProxyCommand=sh", "$(reboot)", "<nobody>"])
def test_a_filled_node_address_is_checked_again(tmp_path: Path, value: str) -> None:
    """A placeholder value is the user's text: once filled into cluster.nodes[].address it must still be an
    address (issue 23), or the render stops naming the field."""
    data = fixtures.dp_data()
    nodes = data["cluster"]["nodes"]
    i = next(i for i, n in enumerate(nodes) if n["address"].startswith("<"))
    data["placeholders"][nodes[i]["address"]] = value
    project = write_project(tmp_path / "p", data)
    with pytest.raises(SpecError) as err:
        render_seed(project, "podman", fixtures.DP_NAME, tmp_path / "out")
    assert f"cluster.nodes[{i}].address" in [f for f, _ in err.value.problems], str(err.value)
