"""The ``model`` and ``secondary_models`` sections: the checkpoint served, and the Hub models the engine loads
besides it (draft model, tokenizer, LoRA adapters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from rigsmith.spec.fields import PLACEHOLDER_RE, SHA1_RE, Frozen, container_abs, hub_repo_id


class ConfigPatch(Frozen):
    """A change to a JSON file of the checkpoint, applied after the download is verified."""

    file: str = Field("config.json", description="File in the model dir, relative.")
    key: str = Field(description="Dotted path inside the JSON, e.g. text_config.ple_embedding_dtype.")
    value: Any = Field(description="Value to set.")
    note: str | None = None

    @field_validator("file")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts:
            raise ValueError("must be a path inside the model dir (no leading /, no ..)")
        return v


class ModelSpec(Frozen):
    """The checkpoint: where it comes from on the Hub and where it lives on the host.

    ``repo: null`` is a local checkpoint: ``local_dir`` already holds it, rigsmith downloads and pins nothing
    (so ``revision`` and the download patterns have no meaning there).
    """

    repo: str | None = Field(
        None,
        description="Hugging Face repo id, owner/name; null for a checkpoint already on disk at local_dir "
        "(rigsmith then downloads and pins nothing); a placeholder token such as '<MODEL>' (a variable the "
        "recipe never set) until placeholders gives its value.",
    )
    revision: str | None = Field(
        None, description="40-hex commit (pinned) or a branch/tag that `invoke pin` resolves into the lock."
    )
    local_dir: str = Field(description="Host directory the checkpoint is downloaded to (may start with ~/).")
    container_path: str = Field("/model", description="Where local_dir is mounted inside the container.")
    size_bytes: int | None = Field(None, ge=0, description="Expected total size, for the disk check.")
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    config_patches: tuple[ConfigPatch, ...] = ()

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not hub_repo_id(v) and not PLACEHOLDER_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a Hub repo id; write it as owner/name (or null for a checkpoint already in "
                "local_dir)"
            )
        return v

    @field_validator("revision", "allow_patterns", "ignore_patterns")
    @classmethod
    def _hub_only(cls, v: Any, info: ValidationInfo) -> Any:
        # repo is declared first, so it is in info.data unless it failed its own check.
        if v and "repo" in info.data and info.data["repo"] is None:
            raise ValueError(
                f"needs a Hub repo, but model.repo is null (a checkpoint already in local_dir); remove "
                f"{info.field_name} or set repo to owner/name"
            )
        return v

    @property
    def local(self) -> bool:
        """A checkpoint already on disk: nothing to download, pin or verify against the Hub."""
        return self.repo is None

    @field_validator("container_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        return container_abs(v)

    @property
    def pinned(self) -> bool:
        """True when the revision is already a full commit sha."""
        return self.revision is not None and bool(SHA1_RE.match(self.revision))


class SecondaryModel(Frozen):
    """A Hub model the engine loads besides ``model``: a speculative draft model (``--speculative-config``
    ``"model"``), a tokenizer (``--tokenizer``) or a LoRA adapter (``--lora-modules NAME=REPO``).

    Recorded so it can be locked, fetched and mounted like the main model; ``arg`` is the index in
    ``engine.args`` of the word that names it.
    """

    role: Literal["speculative", "tokenizer", "lora"]
    repo: str = Field(description="Hugging Face repo id, owner/name.")
    revision: str | None = Field(None, description="Commit or branch; null: the default branch at pin time.")
    name: str | None = Field(None, description="The LoRA adapter's name (``--lora-modules NAME=REPO``).")
    arg: int = Field(ge=0, description="Index in engine.args of the word that names the model.")
    local_dir: str | None = Field(
        None,
        description="Host directory it is fetched into (null: a sibling of model.local_dir named after the "
        "repo; a dedicated directory, like model.local_dir).",
    )
    container_path: str | None = Field(
        None, description="Where local_dir is mounted (read-only) in the container (null: /models/DIRNAME)."
    )
    allow_patterns: tuple[str, ...] = Field(
        (), description="Files fetched (empty: every file; a tokenizer: its tokenizer and config files)."
    )

    @field_validator("container_path")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        return None if v is None else container_abs(v)

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not hub_repo_id(v):
            raise ValueError(f"{v!r} is not a Hub repo id; write it as owner/name")
        return v
