"""Who could reach a container recipe's API, and the address every target makes vLLM listen on. Pure.

A ``docker run``/compose recipe decides its exposure with port publishes: ``-p 127.0.0.1:8000:8000`` is
"only this machine may call it", whatever ``--host 0.0.0.0`` says inside the container. Every rigsmith
target runs with host networking (GPU containers gain nothing from a bridge, and one address per target
keeps the targets equal), where vLLM's own bind address *is* the exposure. So the publish is carried as
``network.listen``: the targets replace (or add) ``--host`` with that address. Decision (issue 24), the
safe way round:

- ``--network host`` (or compose ``network_mode: host``): the args decide, as they did in the recipe.
- a publish of the API port on every address (``-p 8000:8000``, ``-P``): the args decide.
- every publish of the API port on one address (``127.0.0.1``, ``::1``, a LAN address): listen there.
- no publish of the API port: only this machine reached it (through the engine's bridge): loopback.
- publishes on several distinct addresses: refused (vLLM listens on one address).

Kubernetes has no host loopback of its own: the kube target runs the pod with ``hostNetwork``, so a
loopback ``--host`` is the node's loopback, reached on the node (the Service's cluster address does not
reach it).
"""

from __future__ import annotations

import ipaddress

from rigsmith.digits import ascii_digits
from rigsmith.importing.recipe.flags import flag_values
from rigsmith.importing.recipe.launch import Launch

#: vLLM's default ``--port``.
_VLLM_PORT = 8000


def _split(value: str) -> tuple[str, str, str]:
    """``[IP:][HOST:]CONTAINER[/PROTO]`` (IPv6 in brackets) → (ip, host port, container port)."""
    v = value.split("/", 1)[0]
    if v.startswith("["):
        ip, _, rest = v[1:].partition("]")
        host, _, cont = rest.removeprefix(":").rpartition(":")
        return ip, host, cont
    parts = v.split(":")
    if len(parts) == 1:
        return "", "", parts[0]
    if len(parts) == 2:
        return "", parts[0], parts[1]
    return ":".join(parts[:-2]), parts[-2], parts[-1]


def _covers(ports: str, port: int) -> bool:
    """Whether the container side ``ports`` (``8000`` or a range ``8000-8010``) holds ``port``."""
    low, _, high = ports.partition("-")
    if not ascii_digits(low) or (high and not ascii_digits(high)):
        return False
    return int(low) <= port <= int(high or low)


def _address(ip: str) -> str | None:
    """The address a publish binds (None: every address)."""
    if ip in ("", "0.0.0.0", "::"):
        return None
    if ip == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return ip


def listen_address(launch: Launch, notes: list[str], problems: list[str]) -> str | None:
    """The address every target makes vLLM listen on (``network.listen``), with the decision in ``notes``;
    None when the args decide (not a container recipe, host networking, a publish on every address)."""
    if launch.image is None or launch.published is None or launch.network == "host":
        return None
    given = flag_values(launch.args, "--port")
    port = int(given[-1][1]) if given and ascii_digits(given[-1][1]) else _VLLM_PORT
    mine = [(raw, *_split(raw)) for raw in launch.published if raw == "" or _covers(_split(raw)[2], port)]
    hosts = sorted({h for _, _, h, _ in mine if h and h != str(port)})
    if hosts:
        notes.append(
            f"the recipe published the API (container port {port}) on host port {', '.join(hosts)}; host "
            f"networking serves it on {port}: set --port {hosts[0]} in engine.args if clients call that port"
        )
    if any(raw == "" or _address(ip) is None for raw, ip, _, _ in mine):
        return None
    host_flag = flag_values(launch.args, "--host")
    replaces = f" (replacing --host {host_flag[-1][1]})" if host_flag else ""
    if not mine:
        how = f"--network {launch.network}, " if launch.network else ""
        notes.append(
            f"decision: the recipe publishes no port for its API ({how}container port {port}), so only this "
            "machine could reach it; every target runs with host networking, so network.listen: 127.0.0.1 "
            f"makes vLLM listen on loopback only{replaces} — exposure no wider than the recipe's (kube: the "
            "node's loopback, not the Service). Set network.listen to another address to widen it"
        )
        return "127.0.0.1"
    addresses = sorted({a for _, ip, _, _ in mine if (a := _address(ip)) is not None})
    if len(addresses) > 1:
        problems.append(
            f"the recipe publishes its API (container port {port}) on {', '.join(addresses)}: several "
            "addresses, while every rigsmith target runs vLLM with host networking, listening on one "
            "address; keep the one publish you mean (-p ADDRESS:PORT:PORT) and import again"
        )
        return None
    shown = " ".join(f"-p {raw}" for raw, *_ in mine)
    notes.append(
        f"decision: the recipe publishes its API only on {addresses[0]} ({shown}); every target runs with "
        f"host networking, so network.listen: {addresses[0]} makes vLLM listen there{replaces} — exposure no "
        "wider than the recipe's (kube: hostNetwork, so the node's address; the Service's cluster address "
        "does not reach a loopback listener). Set network.listen: null to let the args decide"
    )
    return addresses[0]
