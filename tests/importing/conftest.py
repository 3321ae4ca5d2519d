"""Recipe-import fixtures: the corpus, the seed recipe, and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rigsmith.project import Project
from tests.support.recipes import RecipeServer


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
