"""The recipe site and the CLI of the journeys: a static server for examples/recipes/ on 127.0.0.1, and
`invoke` run in a separate process against a checkout."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

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
