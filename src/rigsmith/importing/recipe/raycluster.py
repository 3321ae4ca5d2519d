"""Ray multi-node recipes (issue 15): the head's and each worker's ``ray start`` container and the
``vllm serve`` the head runs, as one Ray-layout spec.

Recognised forms, as vLLM publishes them:

- ``bash run_cluster.sh IMAGE HEAD_IP --head|--worker HF_HOME [docker run args…]`` (vLLM's
  examples/online_serving/run_cluster.sh; docs/serving/distributed_serving.md). The script runs
  ``docker run --entrypoint /bin/bash --network host --shm-size 10.24g --gpus all -v HF_HOME:/root/.cache/
  huggingface ARGS… IMAGE -c "ray start --block --head --node-ip-address=HEAD_IP --port=6379"`` (workers:
  ``--address=HEAD_IP:6379``); that is the command imported.
- That ``docker run`` (or ``podman run``) written out: ``--entrypoint /bin/bash IMAGE -c "ray start …"`` or
  ``IMAGE bash -c "ray start …"``.
- The serve command: ``vllm serve …`` or ``python3 -m vllm.entrypoints.openai.api_server …`` (env
  assignments before it allowed), or ``docker exec [opts] CONTAINER`` + that command. A ``docker exec -it
  CONTAINER /bin/bash`` line (a shell in the head's container, where the serve command is typed) is noted.

The head's container options (image, env, mounts, shm, GPUs) and the serve argv become the spec as for one
``docker run … IMAGE vllm serve …``; each node's address (VLLM_HOST_IP, else ``--node-ip-address``, else the
head address the commands name) and interface (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) become
``cluster.nodes``. A block with a head or worker but not all three parts is refused, naming the missing one.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from rigsmith import spec as specmod
from rigsmith.digits import ascii_digits
from rigsmith.importing import shellwords
from rigsmith.importing.recipe.command.dockerrun import docker_options, docker_run
from rigsmith.importing.recipe.envvars import env_var
from rigsmith.importing.recipe.flags import flag_values
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _ASSIGN_RE, _PYTHON_RE, _SHELLS, LAUNCHERS

RUN_CLUSTER = "run_cluster.sh"
#: Variables the node facts come from, and those run_cluster.sh derives from VLLM_HOST_IP for Ray (the
#: head and worker scripts rigsmith renders pass --node-ip-address instead): none stays in the spec's env.
NODE_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_RAY_IP_ENV = ("RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS")
#: Variables that select GPUs on one host; in a cluster each node's cdi_devices select them.
GPU_SELECT_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_DEFAULT_RAY_PORT = 6379
_W = shellwords.Word


@dataclass
class RayNode:
    """One node's ``ray start`` container: its role, the docker words up to the image (no entrypoint),
    its ``ray start`` argv and what its options say (env, GPUs, image, mounts)."""

    role: Literal["head", "worker"]
    line: int
    docker: list[shellwords.Word]
    ray: list[str]
    facts: Launch = field(default_factory=Launch)


@dataclass
class RayGroup:
    """A block that is a Ray cluster: its nodes (head first), the serve command's words, notes."""

    nodes: list[RayNode]
    serve: list[shellwords.Word]
    serve_line: int
    notes: list[str] = field(default_factory=list)
    #: False when a part is missing (the problem, naming it, is in the launch).
    complete: bool = True


def _ray_start(script: str) -> list[str] | None:
    """The ``ray start`` argv a ``bash -c`` script runs (other commands in it are ignored), or None."""
    found = [c.argv for c in shellwords.scan(script).commands if c.argv[:2] == ["ray", "start"]]
    return found[0] if len(found) == 1 else None


def _flag(argv: Sequence[str], name: str) -> str | None:
    found = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith(name + "="):
            found = a.split("=", 1)[1]
    return found


def _run_cluster(cmd: shellwords.Command) -> RayNode | None:
    """``[bash|sh] [path/]run_cluster.sh IMAGE HEAD --head|--worker HF_HOME ARGS…`` as its docker run."""
    words = list(cmd.words)
    if words and PurePosixPath(words[0].text).name in _SHELLS:
        words = words[1:]
    if not words or PurePosixPath(words[0].text).name != RUN_CLUSTER or len(words) < 5:
        return None
    image, head, kind, hf_home = words[1:5]
    if kind.text not in ("--head", "--worker"):
        return None
    role: Literal["head", "worker"] = "head" if kind.text == "--head" else "worker"
    ray = ["ray", "start", "--block"] + (
        ["--head", f"--node-ip-address={head.text}", f"--port={_DEFAULT_RAY_PORT}"]
        if role == "head"
        else [f"--address={head.text}:{_DEFAULT_RAY_PORT}"]
    )
    line = cmd.line
    fixed = ["docker", "run", "--network", "host", "--shm-size", "10.24g", "--gpus", "all", "-v"]
    docker = [_W(t, line) for t in fixed]
    docker.append(_W(f"{hf_home.text}:/root/.cache/huggingface", line, hf_home.expands))
    return RayNode(role, line, [*docker, *words[5:], image], ray)


def _docker_ray(cmd: shellwords.Command) -> RayNode | None:
    """``docker|podman run … --entrypoint /bin/bash IMAGE -c "ray start …"`` (or ``IMAGE bash -c …``)."""
    words = list(cmd.words)
    if (
        len(words) < 3
        or PurePosixPath(words[0].text).name not in ("docker", "podman")
        or words[1].text != "run"
    ):
        return None
    rest = words[2:]
    opts = docker_options(rest, Launch(), cmd.line, words[0].text)
    if opts is None or opts.image_at >= len(rest):
        return None
    after = [w.text for w in rest[opts.image_at + 1 :]]
    shell = opts.entrypoint
    if shell is None and after:
        shell, after = after[0], after[1:]
    if shell is None or PurePosixPath(shell).name not in _SHELLS or len(after) != 2 or after[0] != "-c":
        return None
    ray = _ray_start(after[1])
    if ray is None:
        return None
    role: Literal["head", "worker"] = "head" if "--head" in ray else "worker"
    span = opts.entrypoint_span or (0, 0)
    kept = [w for k, w in enumerate(rest[: opts.image_at]) if not span[0] <= k < span[1]]
    image = rest[opts.image_at]
    return RayNode(role, cmd.line, [*words[:2], *kept, image], ray)


def _serve_words(cmd: shellwords.Command) -> list[shellwords.Word] | None:
    """The serve command's words (env assignments first kept), ``docker exec … CONTAINER`` removed."""
    words = list(cmd.words)
    k = 0
    while k < len(words) and _ASSIGN_RE.match(words[k].text):
        k += 1
    body = words[k:]
    if len(body) > 2 and PurePosixPath(body[0].text).name in ("docker", "podman") and body[1].text == "exec":
        i = 2
        while i < len(body) and body[i].text.startswith("-"):
            i += 2 if body[i].text in ("-e", "--env", "-w", "--workdir", "-u", "--user") else 1
        body = body[i + 1 :]
    texts = [w.text for w in body]
    if (texts and PurePosixPath(texts[0]).name == "vllm" and texts[1:2] == ["serve"]) or (
        len(texts) > 2
        and _PYTHON_RE.match(PurePosixPath(texts[0]).name)
        and texts[1:3] == ["-m", LAUNCHERS["python"][1][1]]
    ):
        return [*words[:k], *body]
    return None


def _is_exec_shell(cmd: shellwords.Command) -> bool:
    """``docker exec [-it] CONTAINER /bin/bash``: a shell in the head's container."""
    a = cmd.argv
    return (
        len(a) >= 4
        and PurePosixPath(a[0]).name in ("docker", "podman")
        and a[1] == "exec"
        and PurePosixPath(a[-1]).name in _SHELLS
    )


def split(commands: Sequence[shellwords.Command], launch: Launch) -> RayGroup | None:
    """The block as a Ray cluster, or None when no command in it starts a Ray node (the caller goes on as
    before). A Ray block missing its head, a worker or the serve command puts one problem in ``launch``
    naming what is missing, and returns None too."""
    nodes: list[RayNode] = []
    serve: list[tuple[int, list[shellwords.Word]]] = []
    notes: list[str] = []
    others: list[shellwords.Command] = []
    for cmd in commands:
        node = _run_cluster(cmd) or _docker_ray(cmd)
        if node is not None:
            nodes.append(node)
            if PurePosixPath(cmd.argv[0]).name != "docker" or cmd.argv[1:2] != ["run"]:
                notes.append(
                    f"line {cmd.line}: {RUN_CLUSTER} (vLLM's examples/online_serving) imported as "
                    f"the docker run "
                    "it performs: --entrypoint /bin/bash --network host --shm-size 10.24g --gpus all -v "
                    f"HF_HOME:/root/.cache/huggingface … IMAGE -c '{' '.join(node.ray)}'"
                )
        elif _is_exec_shell(cmd):
            notes.append(
                f"line {cmd.line}: '{' '.join(cmd.argv)}' opens a shell in the head's container; the serve "
                "command after it is what runs there"
            )
        elif (words := _serve_words(cmd)) is not None:
            serve.append((cmd.line, words))
        else:
            others.append(cmd)
    if not nodes:
        return None
    heads = [n for n in nodes if n.role == "head"]
    missing = []
    if len(heads) != 1:
        missing.append(
            "the head's command is not given (ray start --head, or run_cluster.sh … --head)"
            if not heads
            else (
                f"{len(heads)} head commands (lines {', '.join(str(n.line) for n in heads)}); a "
                f"cluster has one"
            )
        )
    if len(heads) == len(nodes):
        missing.append(
            "no worker command is given (ray start --address=HEAD:PORT, or run_cluster.sh … --worker)"
        )
    if len(serve) != 1:
        missing.append(
            "the serve command is not given (vllm serve MODEL --tensor-parallel-size T "
            "--pipeline-parallel-size P "
            "--distributed-executor-backend ray, run in the head's container)"
            if not serve
            else (
                f"{len(serve)} serve commands (lines {', '.join(str(ln) for ln, _ in serve)}); the "
                f"head runs one"
            )
        )
    missing += [
        f"line {c.line}: {c.argv[0]!r} is neither a node's ray start container nor the serve "
        f"command; remove it"
        for c in others
    ]
    nodes.sort(key=lambda n: n.role != "head")
    if missing:
        launch.problems.append(
            "a Ray multi-node recipe (a head's and each worker's ray start container, and the vllm serve the "
            "head runs) imports as one spec, but here "
            + "; ".join(missing)
            + ": pass all of them in one block"
        )
        return RayGroup(nodes, [], 0, notes, complete=False)
    return RayGroup(nodes, serve[0][1], serve[0][0], notes)


def apply(group: RayGroup, launch: Launch) -> None:
    """Fill ``launch`` from a complete group: the head's container with the serve argv as the engine, and
    one entry per node in ``launch.ray_nodes`` (addresses, interface, GPUs; the CDI vendor comes later)."""
    launch.notes += group.notes
    words = list(group.serve)
    while words and (m := _ASSIGN_RE.match(words[0].text)):
        launch.env.append(env_var(m.group(1), m.group(2), None, launch, f"line {group.serve_line}"))
        words.pop(0)
    backend = _flag([w.text for w in words], "--distributed-executor-backend")
    if backend is None:
        words += [_W("--distributed-executor-backend", group.serve_line), _W("ray", group.serve_line)]
        launch.notes.append(
            f"line {group.serve_line}: --distributed-executor-backend ray added (vLLM picks Ray by "
            f"itself when "
            "a Ray cluster runs and the GPUs span nodes; rigsmith's head starts it explicitly)"
        )
    elif backend != "ray":
        launch.problems.append(
            f"line {group.serve_line}: the serve command runs --distributed-executor-backend "
            f"{backend}, so the "
            "Ray cluster the other commands start would go unused; use --distributed-executor-backend ray"
        )
    head = group.nodes[0]
    docker_run([*head.docker, *words], launch, head.line)
    for node in group.nodes:
        docker_run(node.docker, node.facts, node.line)
    _env_differences(group, launch)
    launch.notes += [
        f"env {e.name}={e.value} selects GPUs on the head's host; in a cluster each node's cdi_devices "
        "select them (cluster.nodes[].cdi_devices), so it is not imported"
        for e in launch.env
        if e.name in GPU_SELECT_ENV
    ]
    launch.env = [e for e in launch.env if e.name not in (*NODE_ENV, *_RAY_IP_ENV, *GPU_SELECT_ENV)]
    _node_facts(group, launch)


def _env_differences(group: RayGroup, launch: Launch) -> None:
    """Note what a worker's container sets differently from the head's (every node gets the head's)."""
    skip = (*NODE_ENV, *_RAY_IP_ENV, *GPU_SELECT_ENV)
    head = {e.name: e.value for e in group.nodes[0].facts.env if e.name not in skip}
    for node in group.nodes[1:]:
        mine = {e.name: e.value for e in node.facts.env if e.name not in skip}
        differs = sorted(n for n in head.keys() | mine.keys() if head.get(n) != mine.get(n))
        if differs:
            launch.notes.append(
                f"line {node.line}: the worker's env differs from the head's in "
                f"{', '.join(differs)}; every node gets the head's env (one env for the cluster)"
            )
        if node.facts.image != group.nodes[0].facts.image:
            launch.notes.append(
                f"line {node.line}: the worker's image {node.facts.image} is not the head's "
                f"{group.nodes[0].facts.image}; every node runs the head's image"
            )


def _literal(value: str | None, pattern: re.Pattern[str]) -> str | None:
    if not value or "$" in value or specmod.PLACEHOLDER_RE.search(value):
        return None
    return value if pattern.match(value) else None


def _token(value: str | None) -> str | None:
    """``value`` when it is one placeholder that can stand for an address (a variable the text never sets,
    ``<HEAD_IP>``): the node's address is then that placeholder, filled once wherever the text uses it."""
    if value and specmod.PLACEHOLDER_RE.fullmatch(value) and specmod.ADDRESS_RE.match(value):
        return value
    return None


def _env(node: RayNode, name: str) -> str | None:
    return next((e.value for e in node.facts.env if e.name == name), None)


def _node_facts(group: RayGroup, launch: Launch) -> None:
    """Each node's address, interface, GPU indices and the Ray port, into ``launch.ray_nodes``."""
    head = group.nodes[0]
    port = specmod.ascii_int(_flag(head.ray, "--port") or str(_DEFAULT_RAY_PORT)) or _DEFAULT_RAY_PORT
    joined = [(_flag(n.ray, "--address") or "").rpartition(":") for n in group.nodes[1:]]
    per_node = _per_node_gpus(launch, len(group.nodes))
    seen: list[str] = []
    for i, node in enumerate(group.nodes):
        where = f"line {node.line}"
        named = _env(node, "VLLM_HOST_IP") or _flag(node.ray, "--node-ip-address")
        if i == 0 and not _literal(named, specmod.ADDRESS_RE):
            named = next((h for h, _, _ in joined if _literal(h, specmod.ADDRESS_RE)), None) or (
                named or next((h for h, _, _ in joined if _token(h)), None)
            )
        address = _literal(named, specmod.ADDRESS_RE) or _token(named)
        if address is not None and address == _token(named) and address not in seen:
            launch.notes.append(
                f"{where}: the node's address is {address}, a value the text never sets; "
                f"cluster.nodes[{i}].address is that placeholder: fill it"
            )
        elif address is None or address in seen:
            token = f"<node{i} address>"
            why = (
                "not given (no VLLM_HOST_IP or ray start --node-ip-address)"
                if not named
                else f"{named}, another node's too"
                if address
                else f"{named}, not a literal address"
            )
            launch.notes.append(
                f"{where}: the node's address is {why}; cluster.nodes[{i}].address is the placeholder "
                f"{token}: fill it"
            )
            address = token
        seen.append(address)
        ifname = _env(node, "NCCL_SOCKET_IFNAME") or _env(node, "GLOO_SOCKET_IFNAME")
        interface = _literal(ifname, specmod.IFNAME_RE)
        if ifname and interface is None:
            launch.notes.append(
                f"{where}: NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME {ifname} is not an interface name "
                f"rigsmith can "
                f"carry; set cluster.nodes[{i}].interface"
            )
        gpus = (
            node.facts.gpu_indices
            or _visible(node)
            or [str(g) for g in range(node.facts.gpu_count or per_node)]
        )
        launch.ray_nodes.append(
            {
                "name": f"node{i}",
                "address": address,
                **({"interface": interface} if interface else {}),
                "gpus": gpus,
            }
        )
    for (host, _, p), node in zip(joined, group.nodes[1:], strict=True):
        if p and specmod.ascii_int(p) != port:
            launch.problems.append(
                f"line {node.line}: the worker joins port {p}, but the head's Ray port is {port}; "
                f"make them agree"
            )
        if (
            _literal(host, specmod.ADDRESS_RE)
            and not specmod.PLACEHOLDER_RE.fullmatch(host)
            and host != seen[0]
        ):
            launch.problems.append(
                f"line {node.line}: the worker joins {host}, but the head is at {seen[0]}; make them agree"
            )
    launch.ray_port = port
    launch.gpu_count, launch.gpu_indices = len(launch.ray_nodes[0]["gpus"]), None


def _visible(node: RayNode) -> list[str] | None:
    value = next((_env(node, n) for n in GPU_SELECT_ENV if _env(node, n)), None)
    ids = [x.strip() for x in (value or "").split(",") if x.strip()]
    return ids if ids and all(ascii_digits(x) for x in ids) else None


def _per_node_gpus(launch: Launch, nodes: int) -> int:
    """TP × PP × DP of the serve argv over the node count (at least 1)."""
    total = 1
    for canon in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"):
        vals = flag_values(launch.args, canon)
        total *= (specmod.ascii_int(vals[-1][1]) or 1) if vals else 1
    if total % nodes:
        launch.notes.append(
            f"the serve command's {total} GPUs do not divide over {nodes} nodes; fix "
            f"cluster.nodes[].cdi_devices"
        )
    return max(total // nodes, 1)


def cluster_data(launch: Launch, vendor: str) -> tuple[dict[str, object], list[str], list[str]]:
    """The spec's ``cluster`` section for the group in ``launch``, its placeholder tokens and notes."""
    nodes = [
        {**{k: v for k, v in n.items() if k != "gpus"}, "cdi_devices": [f"{vendor}={g}" for g in n["gpus"]]}
        for n in launch.ray_nodes
    ]
    tokens = [str(n["address"]) for n in nodes if specmod.PLACEHOLDER_RE.fullmatch(str(n["address"]))]
    notes = [
        f"{len(nodes)} commands start a Ray cluster: imported as cluster.layout ray with nodes "
        f"{', '.join(str(n['name']) for n in nodes)} (node0 is the head and runs vllm serve; the others join "
        "it); VLLM_HOST_IP, NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME are set per node from cluster.nodes"
    ]
    data: dict[str, object] = {"layout": "ray", "nodes": nodes}
    if launch.ray_port not in (None, _DEFAULT_RAY_PORT):
        data["ray_port"] = launch.ray_port
    return data, tokens, notes
