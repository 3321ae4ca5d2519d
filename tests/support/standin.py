"""A stand-in for a vLLM OpenAI-compatible server, for rigs (and CI) without a GPU.

It serves ``/health``, ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (SSE streaming
included) on 127.0.0.1, emitting tokens at a configured rate after a configured time to first token, and
writes vLLM-like startup lines ("GPU KV cache size: N tokens", "Application startup complete.") to a log,
so ``wait`` and ``bench`` can be exercised end to end. Token *i* of a stream is sent at
``first + i / rate``, ``first`` being when token 0 left (due at ``t0 + ttft``): an absolute schedule, so sleep
jitter does not accumulate, and a late first token is not followed by a catch-up burst.

Run it: ``python -m tests.support.standin --port 8000 --rate 67.4 --ttft 0.2 --log /tmp/standin.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO


@dataclass
class StandinConfig:
    """How the stand-in behaves."""

    model_names: tuple[str, ...] = ("standin",)
    rate: float | None = 100.0  # tokens/s per stream; None = as fast as possible
    ttft: float = 0.0  # seconds from request to first token
    kv_cache_tokens: int = 924_993
    startup_seconds: float = 0.0  # /health answers 503 until then; log lines spread over it
    log: Path | None = None
    max_model_len: int = 262_144
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "tokens": 0})


def startup_lines(cfg: StandinConfig, port: int) -> list[tuple[float, str]]:
    """(fraction of startup time, log line) in the order vLLM prints them."""
    kv = f"{cfg.kv_cache_tokens:,}"
    conc = cfg.kv_cache_tokens / cfg.max_model_len
    return [
        (0.0, "INFO 09-20 10:00:00 [api_server.py:1880] vLLM API server version 0.0.0+standin"),
        (0.1, f"INFO 09-20 10:00:01 [api_server.py:1881] args: model={cfg.model_names[0]!r}"),
        (0.3, "INFO 09-20 10:00:05 [default_loader.py:262] Loading weights took 0.01 seconds"),
        (0.6, f"INFO 09-20 10:00:09 [kv_cache_utils.py:829] GPU KV cache size: {kv} tokens"),
        (
            0.6,
            f"INFO 09-20 10:00:09 [kv_cache_utils.py:833] Maximum concurrency for "
            f"{cfg.max_model_len:,} tokens per request: {conc:.2f}x",
        ),
        (
            0.9,
            f"INFO 09-20 10:00:12 [api_server.py:1920] Starting vLLM API server 0 on http://127.0.0.1:{port}",
        ),
        (1.0, f"INFO:     Started server process [{os.getpid()}]"),
        (1.0, "INFO:     Waiting for application startup."),
        (1.0, "INFO:     Application startup complete."),
    ]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    cfg: StandinConfig
    ready: threading.Event
    write_log: Callable[[str], None]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away mid-stream (a benchmark's last read, a killed wait) is not an error here.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send_json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _access(self, code: int) -> None:
        host, port = self.client_address[:2]
        self.server.write_log(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} OK')

    def do_GET(self) -> None:
        if not self.server.ready.is_set():
            self._send_json(503, {"error": "starting"})
            return
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            models = [
                {
                    "id": m,
                    "object": "model",
                    "owned_by": "vllm",
                    "max_model_len": self.server.cfg.max_model_len,
                }
                for m in self.server.cfg.model_names
            ]
            self._send_json(200, {"object": "list", "data": models})
        else:
            self._send_json(404, {"error": "not found"})
        self._access(200)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send_json(400, {"error": {"message": "body is not JSON"}})
            return
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send_json(404, {"error": "not found"})
            return
        if not self.server.ready.is_set():
            self._send_json(503, {"error": "starting"})
            return
        if req.get("model") not in self.server.cfg.model_names:
            self._send_json(404, {"error": {"message": f"The model `{req.get('model')}` does not exist."}})
            return
        prompt = (
            " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            if chat
            else str(req.get("prompt", ""))
        )
        n_prompt = len(prompt.split())
        n = int(req.get("max_tokens") or 16)
        self.server.cfg.stats["requests"] += 1
        self._access(200)
        if req.get("stream"):
            self._stream(chat, n, n_prompt, bool((req.get("stream_options") or {}).get("include_usage")))
        else:
            self._wait_tokens(n)
            text = " tok" * n
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            self._send_json(
                200,
                {
                    "id": "cmpl-standin",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": req["model"],
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": n_prompt,
                        "completion_tokens": n,
                        "total_tokens": n_prompt + n,
                    },
                },
            )

    def _wait_tokens(self, n: int) -> None:
        cfg = self.server.cfg
        delay = cfg.ttft + ((n - 1) / cfg.rate if cfg.rate else 0.0)
        time.sleep(max(delay, 0.0))

    def _chunk(self, payload: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def _stream(self, chat: bool, n: int, n_prompt: int, usage: bool) -> None:
        cfg = self.server.cfg
        t0 = time.monotonic()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model = json.dumps(cfg.model_names[0])
        if chat:
            head = (
                b'data: {"id":"chatcmpl-standin","object":"chat.completion.chunk","model":%s,"choices":['
                % (model.encode())
            )
            tok = head + b'{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
            last = head + b'{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
        else:
            head = (
                b'data: {"id":"cmpl-standin","object":"text_completion","model":%s,"choices":['
                % model.encode()
            )
            tok = head + b'{"index":0,"text":" tok","finish_reason":null}]}\n\n'
            last = head + b'{"index":0,"text":"","finish_reason":"length"}]}\n\n'
        try:
            first = t0 + cfg.ttft
            for i in range(n):
                if cfg.rate or i == 0:
                    due = first + (i / cfg.rate if cfg.rate else 0.0)
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                self._chunk(tok)
                if cfg.rate:
                    self.wfile.flush()
                if i == 0:
                    # The schedule runs from when the first token really left: a first token made late
                    # by a loaded host must not make the decode rate look faster by a catch-up burst.
                    first = max(first, time.monotonic())
            self._chunk(last)
            if usage:
                u = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
                self._chunk(
                    b'data: {"id":"cmpl-standin","choices":[],"usage":%s}\n\n' % json.dumps(u).encode()
                )
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            cfg.stats["tokens"] += n
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Standin:
    """A running stand-in server (context manager). ``port=0`` picks a free port."""

    def __init__(self, cfg: StandinConfig, port: int = 0, host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.server = _Server((host, port), _Handler)
        self.server.cfg = cfg
        self.server.ready = threading.Event()
        self._log_lock = threading.Lock()
        self._log: TextIO | None = cfg.log.open("a", encoding="utf-8", buffering=1) if cfg.log else None
        self.server.write_log = self._write_log
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_log(self, line: str) -> None:
        if self._log:
            with self._log_lock:
                self._log.write(line + "\n")

    def _startup(self) -> None:
        t0 = time.monotonic()
        for frac, line in startup_lines(self.cfg, self.port):
            pause = t0 + frac * self.cfg.startup_seconds - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            if frac >= 1.0:
                self.server.ready.set()
            self._write_log(line)
        self._write_log(f"INFO:     Uvicorn running on http://127.0.0.1:{self.port} (Press CTRL+C to quit)")

    def start(self) -> Standin:
        for target in (self.server.serve_forever, self._startup):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> Standin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve until SIGTERM/Ctrl-C."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--rate", type=float, default=100.0, help="tokens/s per stream; 0 = unthrottled")
    ap.add_argument("--ttft", type=float, default=0.0, help="seconds to first token")
    ap.add_argument("--startup", type=float, default=0.0, help="seconds until /health is 200")
    ap.add_argument("--kv-cache-tokens", type=int, default=924_993)
    ap.add_argument("--model", action="append", help="served model name (repeatable)")
    ap.add_argument("--log", type=Path, help="append vLLM-like log lines here")
    a = ap.parse_args(argv)
    cfg = StandinConfig(
        tuple(a.model or ["standin"]), a.rate or None, a.ttft, a.kv_cache_tokens, a.startup, a.log
    )
    s = Standin(cfg, a.port).start()
    print(f"standin listening on {s.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        s.stop()


if __name__ == "__main__":
    main()
