"""The ``readiness``, ``network``, ``benchmarks`` and ``proxy`` sections: when the server counts as up, where
it listens, what it must deliver and which proxy fronts it."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator

from rigsmith.spec.fields import Frozen


class Readiness(Frozen):
    """When the deployment counts as up: the recipe's gates."""

    health_path: str = "/health"
    log_lines: tuple[str, ...] = ("Application startup complete",)
    kv_cache_tokens: int | None = Field(None, ge=0, description="Published 'GPU KV cache size: N tokens'.")
    kv_cache_tolerance: float = Field(0.02, ge=0, le=1, description="Relative tolerance on kv_cache_tokens.")
    startup_seconds: int = Field(600, gt=0, description="Expected first-boot time; timeouts derive from it.")
    warm_startup_seconds: int | None = Field(None, gt=0)


class Network(Frozen):
    """Where the OpenAI-compatible server listens."""

    mode: Literal["host", "none"] = "host"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    listen: str | None = Field(
        None,
        description="The address every target makes vLLM listen on (--host LISTEN replaces the args' --host, "
        "or is added). Import sets it when a container recipe published the API on one address only "
        "(-p 127.0.0.1:8000:8000): the targets run with host networking, where vLLM's own bind address is "
        "the exposure. null: the args decide.",
    )

    @field_validator("listen")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 or IPv6 address (write e.g. 127.0.0.1 or ::1)") from None
        return v


class Benchmark(Frozen):
    """A published number the deployment is qualified against."""

    name: str = Field(description="e.g. decode_1stream")
    streams: int = Field(1, ge=1)
    tokens_per_second: float = Field(gt=0)
    tolerance: float = Field(0.1, ge=0, le=1)


class Proxy(Frozen):
    """Registration with a model-switching proxy (llama-swap, a seed's multi-proxy)."""

    family: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    backend_managed: bool = False
