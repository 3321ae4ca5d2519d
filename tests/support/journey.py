"""The recipe site and the CLI of the journeys: a static server for examples/recipes/ on 127.0.0.1, and
`invoke` run in a separate process against a checkout."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.common import REPO

SEED_003 = "qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def recipe_site(recipe: str = SEED_003) -> Iterator[str]:
    """examples/recipes/ over HTTP on 127.0.0.1; yields the recipe's URL."""
    handler = functools.partial(_Quiet, directory=str(REPO / "examples" / "recipes"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{recipe}"
    finally:
        server.shutdown()
        server.server_close()


def invoke_cli(
    root: Path, env: Mapping[str, str] | None, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`invoke ARGS` of this worktree acting on the checkout ``root`` (stdin closed to a terminal)."""
    env = {**(os.environ if env is None else env), "RIGSMITH_ROOT": str(root)}
    env["PYTHONPATH"] = f"{REPO / 'src'}:{REPO}"
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), *args],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )
