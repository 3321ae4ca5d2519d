"""Recipe-import fixtures: the corpus, the seed recipe, and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith.project import Project

REPO = Path(__file__).resolve().parents[2]
#: The 40 published commands (a verbatim copy of the project's shared corpus, so CI needs nothing else).
CORPUS = Path(__file__).with_name("data") / "vllm-commands.json"
SEED_RECIPE = (
    REPO / "examples" / "recipes" / "qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"
)
EXPECTED = Path(__file__).with_name("corpus_expected.yaml")


def corpus() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(CORPUS.read_text(encoding="utf-8"))
    return data


def expected() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load(EXPECTED.read_text(encoding="utf-8"))
    return data


@dataclass
class Route:
    """A scripted response: a list of (status, body) served in turn (the last one repeats)."""

    responses: list[tuple[int, bytes]]
    delay: float = 0.0
    hits: int = 0
    declare_length: int | None = None


@dataclass
class RecipeServer:
    """A real ThreadingHTTPServer on 127.0.0.1 whose routes tests script."""

    base: str
    routes: dict[str, Route] = field(default_factory=dict)

    def route(
        self, path: str, *responses: tuple[int, bytes], delay: float = 0.0, declare_length: int | None = None
    ) -> str:
        self.routes[path] = Route(list(responses), delay, 0, declare_length)
        return self.base + path


@pytest.fixture(scope="session")
def recipe_server() -> Iterator[RecipeServer]:
    server_state: dict[str, RecipeServer] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            srv = server_state["srv"]
            route = srv.routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            route.hits += 1
            status, body = route.responses[min(route.hits, len(route.responses)) - 1]
            if route.delay:
                time.sleep(route.delay)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if (
                    route.declare_length != -1
                ):  # -1: no Content-Length, the body ends when the connection closes
                    self.send_header("Content-Length", str(route.declare_length or len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server_state["srv"] = RecipeServer(f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state["srv"]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def empty_project(tmp_path: Path) -> Project:
    (tmp_path / "deployments").mkdir()
    return Project(tmp_path)
