"""The engine adapter's pure parts, on streams captured from Podman 4.3.1 and Docker 20.10."""

from __future__ import annotations

from typing import Any

import pytest

from rigsmith.errors import AdapterError
from rigsmith.resolving.image import engine as enginemod

#: Captured from Podman 4.3.1's /libpod/build (a no-op rebuild), chunked as the service sends it.
PODMAN_STREAM: list[dict[str, Any]] = [
    {"stream": "STEP 1/3: FROM 127.0.0.1:5055/tinybase@sha256:51ae\n"},
    {"stream": 'STEP 2/3: COPY ["rigsmith/", "/opt/rigsmith/"]\n'},
    {"stream": "--> Using cache 4b4496662ce57ce05ea080aff77a3ca0bf3c932162cd169d37cc147ca35d8d22\n"},
    {"stream": 'STEP 3/3: RUN ["/bin/sh", "-c", "echo hi"]\n--> Using cache 3d86'},
    {"stream": "87baf03ecc3c141d3021638444d5574a8178b9a522c47f1243ec08fe3793\n"},
    {"stream": "COMMIT localhost/rigsmith/tiny:7dfb5c736ec38f8c\n"},
    {"stream": "43826944946b776970c73bad6b8e19ba1e6bacb4e39e5187d5f6f3758ea8eea9\n"},
]

#: Captured from Docker 20.10's classic builder, then a failing step.
DOCKER_STREAM: list[dict[str, Any]] = [
    {"stream": "Step 1/2 : FROM 127.0.0.1:5055/tinybase@sha256:51ae"},
    {"stream": "\n"},
    {"stream": " ---> b3a797ef7c4d\n"},
    {"stream": 'Step 2/2 : RUN ["/bin/sh", "-c", "exit 3"]\n'},
    {"stream": " ---> Running in 2b0c\n"},
    {
        "errorDetail": {"code": 3, "message": "The command '/bin/sh -c exit 3' returned a non-zero code: 3"},
        "error": "The command '/bin/sh -c exit 3' returned a non-zero code: 3",
    },
]


def test_build_log_joins_chunks_into_lines_and_counts_cache_hits() -> None:
    lines: list[str] = []
    log = enginemod.BuildLog(lines.append)
    for ev in PODMAN_STREAM:
        log.feed(ev)
    log.close()
    assert (log.steps, log.cached, log.errors) == (3, 2, [])
    assert "--> Using cache 3d8687baf03ecc3c141d3021638444d5574a8178b9a522c47f1243ec08fe3793" in lines
    assert lines[-1] == "43826944946b776970c73bad6b8e19ba1e6bacb4e39e5187d5f6f3758ea8eea9"


def test_build_log_keeps_the_error() -> None:
    lines: list[str] = []
    log = enginemod.BuildLog(lines.append)
    for ev in DOCKER_STREAM:
        log.feed(ev)
    log.close()
    assert log.steps == 2 and log.cached == 0
    assert log.errors == ["The command '/bin/sh -c exit 3' returned a non-zero code: 3"]
    assert lines[0] == "Step 1/2 : FROM 127.0.0.1:5055/tinybase@sha256:51ae"


def test_push_digest_from_docker_aux_and_podman_status() -> None:
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    docker_events: list[dict[str, Any]] = [
        {"status": "The push refers to repository [127.0.0.1:5055/tiny]"},
        {"status": "Pushed", "progressDetail": {}, "id": "9a01e23c7d82"},
        {"status": f"x: digest: {d1} size: 942"},
        {"progressDetail": {}, "aux": {"Tag": "x", "Digest": d1, "Size": 942}},
    ]
    seen: list[str] = []
    assert enginemod.push_digest(docker_events, seen.append) == d1
    assert "Pushed" not in seen  # per-layer progress is not echoed
    podman_events = [
        {"status": "The push refers to repository [x]"},
        {"status": f"1: digest: {d2} size: 579"},
    ]
    assert enginemod.push_digest(podman_events, lambda _: None) == d2
    with pytest.raises(
        AdapterError, match="push failed: http: server gave HTTP response to HTTPS client"
    ) as err:
        enginemod.push_digest(
            [{"error": "http: server gave HTTP response to HTTPS client", "errorDetail": {}}], lambda _: None
        )
    assert "insecure = true" in str(err.value)


def test_engine_kind_from_version() -> None:
    podman = {"Components": [{"Name": "Podman Engine", "Version": "4.3.1"}], "Version": "4.3.1"}
    docker = {"Components": [{"Name": "Engine", "Version": "20.10.24"}, {"Name": "containerd"}]}
    assert enginemod.engine_kind(podman) == "podman"
    assert enginemod.engine_kind(docker) == "docker"
    assert enginemod.engine_kind({}) == "docker"


def test_socket_candidates_order() -> None:
    env = {
        "DOCKER_HOST": "unix:///d.sock",
        "CONTAINER_HOST": "unix:///p.sock",
        "XDG_RUNTIME_DIR": "/run/user/1",
    }
    assert enginemod.socket_candidates("docker", env) == ["unix:///d.sock", "unix:///var/run/docker.sock"]
    assert enginemod.socket_candidates("podman", env) == [
        "unix:///p.sock",
        "unix:///d.sock",
        "unix:///run/user/1/podman/podman.sock",
        "unix:///run/podman/podman.sock",
    ]
    assert enginemod.socket_candidates(None, {}) == [
        "unix:///run/podman/podman.sock",
        "unix:///var/run/docker.sock",
    ]
