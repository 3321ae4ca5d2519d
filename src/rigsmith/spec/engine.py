"""The ``engine`` and ``env`` sections: how vLLM is started (the recipe's argv, kept exact) and the
environment it gets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rigsmith.spec.fields import ENV_NAME_RE, HOST_REF_RE, NAME_RE, Frozen, matching
from rigsmith.spec.model import ModelSpec


class EngineSpec(Frozen):
    """How vLLM is started: the recipe argv, kept exact, plus the explicit model-path mapping."""

    runtime: Literal["container", "venv"] = "container"
    image: str | None = Field(
        None, description="Container image reference; prefer name@sha256:… (see `invoke build`/`pin`)."
    )
    build: str | None = Field(None, description="Name under images/ whose locked build digest is the image.")
    venv: str | None = Field(None, description="venv directory when runtime is venv.")
    recipe_executable: str = Field("vllm", description="The executable as the recipe wrote it.")
    executable: str = Field("vllm", description="What runs inside the container (its entrypoint).")
    subcommand: tuple[str, ...] = Field(("serve",), description="argv between executable and args.")
    args: tuple[str, ...] = Field(description="The recipe's argv after the subcommand, byte for byte.")
    model_arg: int | None = Field(
        None,
        description="Index in args of the model path, replaced by model.container_path in the container.",
    )

    @field_validator("build")
    @classmethod
    def _build(cls, v: str | None) -> str | None:
        # A directory under images/, a bundle member's folder and an image name: an image definition's name.
        if v is not None and not NAME_RE.match(v):
            raise ValueError(
                f"{v[:100]!r} is not the name of an image definition under images/ (lowercase letters, "
                "digits, '.', '_' or '-', max 63, start alnum)"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> EngineSpec:
        if self.model_arg is not None and not 0 <= self.model_arg < len(self.args):
            raise ValueError(f"model_arg {self.model_arg} is outside args (0..{len(self.args) - 1})")
        if self.image is not None and self.build is not None:
            raise ValueError("set image or build, not both")
        return self

    def container_argv(self, model: ModelSpec) -> list[str]:
        """The exact command the container runs: subcommand + args, model path mapped."""
        return self.argv_with_model(model.container_path)

    def argv_with_model(self, path: str) -> list[str]:
        """Subcommand + args with the model word (if any) pointing at ``path``."""
        args = list(self.args)
        if self.model_arg is not None:
            flag, eq, _ = args[self.model_arg].partition("=")
            # `--model=PATH` is one word: only its value is the model path.
            args[self.model_arg] = f"{flag}={path}" if eq and flag.startswith("-") else path
        return [*self.subcommand, *args]

    def flag_value(self, flag: str) -> str | None:
        """Value of ``--flag V`` or ``--flag=V`` (last one wins, as argparse does)."""
        found: str | None = None
        for i, a in enumerate(self.args):
            if a == flag and i + 1 < len(self.args):
                found = self.args[i + 1]
            elif a.startswith(flag + "="):
                found = a.split("=", 1)[1]
        return found


class EnvVar(Frozen):
    """One environment variable of the recipe."""

    name: Annotated[str, matching(ENV_NAME_RE, "{v!r} is not an environment variable name")]
    value: str
    note: str | None = Field(None, description="The recipe's annotation, verbatim.")
    opt_in: bool = Field(False, description="Published as optional; off unless enabled.")
    enabled: bool = Field(True, description="Opt-in variables start disabled; set true to pass them.")
    secret: bool = Field(False, description="Never written into a generated file; read from an env file.")
    read_by: str | None = Field(
        None,
        description="A switch only the recipe's own script reads (e.g. scripts/serve-v2.5.sh): passed only "
        "when engine.executable is that script.",
    )

    @property
    def active(self) -> bool:
        """Passed to the container."""
        return self.enabled

    @property
    def host_source(self) -> str:
        """The host variable a secret is read from: its own name, or ``OTHER`` for ``value: $OTHER``
        (``--env HUGGING_FACE_HUB_TOKEN=$HF_TOKEN``: the container's NAME gets the host's OTHER)."""
        m = HOST_REF_RE.match(self.value) if self.secret else None
        return (m.group(1) or m.group(2)) if m else self.name
