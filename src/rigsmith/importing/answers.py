"""``import-recipe --answers FILE``: the values a user would type at the import's questions, in a file, so
an import can be repeated (and a test can stand in for the terminal). Pure: YAML text in, answers out.

The file (every key optional)::

    name: flash-next-int4-3x3090      # as --name (the flag wins)
    image: localhost/vllm:1           # as --image (the flag wins)
    published_at: https://…/r.json    # the address a saved copy was published at: provenance.source
    answers:                          # the questions a record leaves open, by the key the question names
      model.local_dir: /srv/models/M
      network.port: 8001
      env.PLE mmap: VLLM_PLE_MMAP=1
    placeholders:                     # values of the recipe's <tokens> (what "fill in before deploy" names)
      <repo>: /opt/merlin
    mounts:                           # bind mounts to add (a host path the recipe's checkout lives at)
      - {host: ~/src/merlin, container: /opt/merlin}

An answer to a question the import did not ask, or a value for a placeholder the recipe does not have, is
refused: the file would otherwise say something the spec does not.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing.recipe.record.ask import Ask

_HINT = "fix the answers file (see docs/guide.md § Answers files) and import again"


class Answers(BaseModel):
    """An answers file, validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    image: str | None = None
    published_at: str | None = None
    answers: dict[str, str] = Field(default_factory=dict)
    placeholders: dict[str, str] = Field(default_factory=dict)
    mounts: tuple[specmod.Mount, ...] = ()

    @field_validator("answers", "placeholders", mode="before")
    @classmethod
    def _strings(cls, v: Any) -> Any:
        """Numbers (``network.port: 8001``) are answers as typed."""
        if isinstance(v, dict):
            return {
                str(k): str(x) if isinstance(x, int | float) and not isinstance(x, bool) else x
                for k, x in v.items()
            }
        return v

    def answer(self, ask: Ask) -> str | None:
        """The file's answer to ``ask`` (``placeholders.<T>`` is also read from ``placeholders:``)."""
        if ask.key in self.answers:
            return self.answers[ask.key]
        token = ask.key.removeprefix("placeholders.")
        return self.placeholders.get(token) if token != ask.key else None


def load(text: str, where: str) -> Answers:
    """The answers file ``where`` (its text), or RecipeError naming the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{where}: not YAML ({err})", hint=_HINT) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(
            f"{where}: an answers file is a mapping (name:, answers:, placeholders: …)", hint=_HINT
        )
    try:
        return Answers.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{p}: {m}" for p, m in specmod.problems_from(err))
        raise RecipeError(f"{where}: {problems}", hint=_HINT) from None


def unused(answers: Answers, asked: list[str], dep: specmod.Deployment, where: str) -> None:
    """Refuse answers to questions the import did not ask and placeholders the recipe does not have."""
    extra = [k for k in answers.answers if k not in asked]
    extra += [
        f"placeholders.{t}"
        for t in answers.placeholders
        if t not in dep.placeholders and f"placeholders.{t}" not in asked
    ]
    if extra:
        raise RecipeError(
            f"{where}: {', '.join(extra)}: the import asked no such question and the recipe has no such "
            f"placeholder (its questions: {', '.join(asked) or 'none'}; its placeholders: "
            f"{', '.join(dep.placeholders) or 'none'}); nothing was written",
            hint=_HINT,
        )


def apply(answers: Answers, dep: specmod.Deployment, asked: list[str]) -> specmod.Deployment:
    """``dep`` with the file's placeholder values, mounts and published address."""
    data = specmod.to_data(dep)
    filled = {
        t: v
        for t, v in answers.placeholders.items()
        if t in dep.placeholders and f"placeholders.{t}" not in asked
    }
    if filled:
        data["placeholders"] = {**data.get("placeholders", {}), **filled}
    if answers.mounts:
        data["mounts"] = [
            *data.get("mounts", []),
            *(m.model_dump(exclude_defaults=True) for m in answers.mounts),
        ]
    if answers.published_at and data.get("provenance"):
        data["provenance"]["source"] = answers.published_at
    return specmod.from_data(data, "the answers file")
