"""The whole spec, ``deployments/NAME.yaml``: every section together, the rules that span sections, and the
facts derived from them (placeholders still to fill, the active env)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rigsmith.modeldir import HINT as MODEL_DIR_HINT
from rigsmith.modeldir import model_dir_problem
from rigsmith.spec.cluster import Cluster
from rigsmith.spec.engine import EngineSpec, EnvVar
from rigsmith.spec.fields import (
    NAME_RE,
    PLACEHOLDER_RE,
    SPEC_VERSION,
    Frozen,
    ascii_int,
    hub_repo_id,
    matching,
    repeated,
)
from rigsmith.spec.model import ModelSpec, SecondaryModel
from rigsmith.spec.placement import placement_problem
from rigsmith.spec.provenance import IMAGE_NOT_TAKEN, NotTaken, Provenance
from rigsmith.spec.resources import Mount, Resources
from rigsmith.spec.serving import Benchmark, Network, Proxy, Readiness


class Deployment(Frozen):
    """A deployment spec, as stored in ``deployments/NAME.yaml``."""

    version: Literal[1] = SPEC_VERSION
    name: Annotated[
        str, matching(NAME_RE, "{v!r}: use lowercase letters, digits, '.', '_' or '-' (max 63), start alnum")
    ]
    description: str | None = None
    model: ModelSpec
    secondary_models: tuple[SecondaryModel, ...] = Field(
        (), description="Hub models the engine loads besides model (draft, tokenizer, LoRA adapters)."
    )
    engine: EngineSpec
    env: tuple[EnvVar, ...] = ()
    env_notes: tuple[str, ...] = Field((), description="Free-text annotations of the recipe's env, verbatim.")
    placeholders: dict[str, str | None] = Field(
        default_factory=dict,
        description="Placeholder tokens found in the recipe (e.g. '<repo>') and the user's values; "
        "deploy refuses while any is null.",
    )
    resources: Resources
    mounts: tuple[Mount, ...] = ()
    readiness: Readiness = Readiness()
    network: Network = Network()
    benchmarks: tuple[Benchmark, ...] = ()
    proxy: Proxy | None = None
    podman_version: str | None = Field(None, description="Target host's podman version, e.g. 4.9.3.")
    notes: tuple[str, ...] = Field((), description="What the recipe said that has no field, verbatim.")
    not_taken: tuple[NotTaken, ...] = Field(
        (),
        description="Items of the recipe deliberately not imported, each with the reason (a record's ops "
        "commands, a truncated digest, a comparison with another engine).",
    )
    provenance: Provenance | None = None
    cluster: Cluster | None = Field(None, description="Several nodes serving this model (null: one host).")

    @model_validator(mode="before")
    @classmethod
    def _filled_model(cls, data: Any) -> Any:
        """A model that is a placeholder (``model.repo: <MODEL>``) is what ``placeholders`` gives it, once
        given: a Hub repo, or a checkpoint's directory on disk (then model.repo is null and local_dir that
        directory); the token in local_dir and container_path becomes its name."""
        if not isinstance(data, dict) or not isinstance(model := data.get("model"), dict):
            return data
        token, filled = model.get("repo"), data.get("placeholders")
        if not (isinstance(token, str) and PLACEHOLDER_RE.fullmatch(token) and isinstance(filled, dict)):
            return data
        value = filled.get(token)
        if not isinstance(value, str) or not value.strip():
            return data
        local = value.startswith(("/", "~/"))
        if not local and not hub_repo_id(value):
            raise ValueError(
                f"placeholders[{token!r}]: {value!r} is the model (model.repo is {token}) and must be its "
                "Hub repo id (owner/name) or the absolute (or ~/) directory of a checkpoint already on disk"
            )
        # The directory becomes model.local_dir: the model-dir rule of every other model dir, said here
        # where the user wrote it.
        why = model_dir_problem(value, "") if local else None
        if why:
            raise ValueError(
                f"placeholders[{token!r}]: {value!r} is the model's directory, but {why}; {MODEL_DIR_HINT}"
            )
        name = value.rstrip("/").rsplit("/", 1)[-1]
        paths = {
            k: v.replace(token, name)
            for k in ("local_dir", "container_path")
            if isinstance(v := model.get(k), str)
        }
        if local:
            return {**data, "model": {**model, **paths, "repo": None, "local_dir": value}}
        return {**data, "model": {**model, "repo": value, **paths}}

    @model_validator(mode="after")
    def _cross(self) -> Deployment:
        dup = repeated(e.name for e in self.env if e.active)
        if dup:
            raise ValueError(f"env: {dup} set more than once among enabled variables")
        dupm = repeated([m.container for m in self.mounts] + [self.model.container_path])
        if dupm:
            raise ValueError(f"mounts: container paths {dupm} used twice (model.container_path counts)")
        for i, sm in enumerate(self.secondary_models):
            if sm.arg >= len(self.engine.args):
                raise ValueError(
                    f"secondary_models[{i}].arg {sm.arg} is outside engine.args "
                    f"(0..{len(self.engine.args) - 1})"
                )
        problem = placement_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    # -- derived facts -----------------------------------------------------------------------------

    def active_env(self) -> list[EnvVar]:
        """Variables passed to the engine, in recipe order."""
        return [e for e in self.env if e.active]

    def why_no_image(self) -> str:
        """Why a spec with no engine.image and no engine.build has none: the recipe's image that import left
        out (a ``not_taken`` entry under :data:`IMAGE_NOT_TAKEN`, with its reason), else a recipe run outside
        a container."""
        left = [n for n in self.not_taken if n.item.startswith(IMAGE_NOT_TAKEN)]
        return f"{left[0].item}: {left[0].why}" if left else "the recipe ran vLLM outside a container"

    @property
    def model_placeholder(self) -> str | None:
        """The placeholder token the model still is (``<MODEL>``: fill ``placeholders``), or None."""
        repo = self.model.repo
        return repo if repo is not None and PLACEHOLDER_RE.fullmatch(repo) else None

    def fill_problems(self) -> list[tuple[str, str]]:
        """Each placeholder still to fill, by the field that holds it, with what to write there."""
        out = []
        for tok in self.unfilled_placeholders():
            if tok == self.model_placeholder:
                out.append(
                    (
                        "model.repo",
                        f"is the placeholder {tok} (the recipe leaves the model for you to give); "
                        f"set `placeholders: {{{tok!r}: OWNER/NAME}}` in the spec (the model's Hub repo id, "
                        "or the absolute directory of a checkpoint on disk)",
                    )
                )
            else:
                out.append(
                    (
                        "placeholders",
                        f"{tok!r} has no value; set `placeholders: {{{tok!r}: VALUE}}` in the spec "
                        "(it is used by the recipe's args, env or a mount's host path)",
                    )
                )
        return out

    def unfilled_placeholders(self) -> list[str]:
        """Placeholder tokens still used by an active value and without a user value."""
        used: set[str] = {self.model_placeholder} if self.model_placeholder else set()
        cluster = self.cluster.nodes if self.cluster else ()
        for text in [
            *self.engine.args,
            *(e.value for e in self.active_env()),
            *(n.address for n in cluster),
            *(a for n in cluster for a in n.args or ()),
            *(m.host for m in self.mounts),
        ]:
            used.update(PLACEHOLDER_RE.findall(text))
        return sorted(t for t in used if not self.placeholders.get(t))

    def fill(self, text: str) -> str:
        """Replace filled placeholder tokens in ``text``."""
        for token, value in self.placeholders.items():
            if value:
                text = text.replace(token, value)
        return text

    @property
    def shutdown_timeout(self) -> int | None:
        """vLLM's own ``--shutdown-timeout`` from the args, if set."""
        v = self.engine.flag_value("--shutdown-timeout")
        return None if v is None else ascii_int(v)
