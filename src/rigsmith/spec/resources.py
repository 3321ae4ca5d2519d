"""The ``resources`` and ``mounts`` sections: what the container takes from its host (GPUs, memory, /dev/shm,
host paths)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rigsmith.spec.fields import MAX_GPUS, Frozen, cdi_names, parse_size


class GpuSpec(Frozen):
    """The GPUs the recipe needs and the CDI names that give them to a container."""

    count: int = Field(ge=0, le=MAX_GPUS)
    model: str | None = Field(None, description="e.g. RTX 3090")
    arch: str | None = Field(None, description="e.g. sm_86")
    vram_gib: float | None = Field(None, ge=0, description="Per GPU.")
    cdi_devices: tuple[str, ...] = Field(
        max_length=MAX_GPUS, description="Fully qualified CDI names, e.g. nvidia.com/gpu=0."
    )
    p2p: Literal["required", "recommended", "not-needed", "unknown"] = "unknown"
    nvlink: bool | None = None

    @field_validator("cdi_devices")
    @classmethod
    def _cdi(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return cdi_names(v)


class Resources(Frozen):
    """Host resources and container limits."""

    gpus: GpuSpec
    host_ram_gib: float | None = Field(None, ge=0)
    disk_gib: float | None = Field(None, ge=0)
    shm_size: str = Field("8g", description="/dev/shm size for the container (podman --shm-size syntax).")
    memlock: Literal["unlimited", "host"] | int = Field(
        "unlimited",
        description="RLIMIT_MEMLOCK: unlimited, bytes, or host (inherit the runtime's limit, set nothing; "
        "for "
        "hosts such as unprivileged LXC that cannot raise it).",
    )
    stop_grace_seconds: int = Field(70, gt=0, description="Container stop timeout (SIGTERM → SIGKILL).")

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        parse_size(v)
        return v

    @property
    def shm_bytes(self) -> int:
        """shm_size in bytes."""
        return parse_size(self.shm_size)


class Mount(Frozen):
    """A host path made visible inside the container."""

    host: str
    container: str
    readonly: bool = False
    kind: Literal["dir", "file"] = "dir"
    sparse_size: int | None = Field(
        None, ge=1, description="File mounts: must pre-exist at exactly this size; created sparse if missing."
    )
    note: str | None = None
    consent: str | None = Field(
        None,
        description="Your reason for mounting a dangerous host path (/, a home directory, a socket, /etc, "
        "/dev, the container engine's storage, a dot-directory); import asks for it and deploy refuses such "
        "a mount without it.",
    )

    @model_validator(mode="after")
    def _check(self) -> Mount:
        if not self.container.startswith("/"):
            raise ValueError("container must be an absolute path")
        if self.sparse_size is not None and self.kind != "file":
            raise ValueError("sparse_size needs kind: file")
        if self.kind == "file" and self.host.rsplit("/", 1)[-1] in ("", ".", "..", "~"):
            raise ValueError(
                f"host {self.host!r} names a directory, not a file (kind: file); write the file's path"
            )
        return self
