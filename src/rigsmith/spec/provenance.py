"""The ``provenance`` and ``not_taken`` sections: where an imported recipe came from, and what of it was left
out on purpose."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from rigsmith.spec.fields import Frozen

#: How a ``not_taken`` item that is the recipe's own image (a digest that cannot be pulled) begins.
IMAGE_NOT_TAKEN = "pinned by image digest"


class NotTaken(Frozen):
    """An item of the recipe that is in no field and no note on purpose, and why (import writes these)."""

    item: str = Field(description="The item, as the recipe writes it.")
    why: str = Field(description="Why it was not taken, and what stands in for it.")


class Provenance(Frozen):
    """Where an imported recipe came from."""

    source: str
    sha256: str
    title: str | None = None
    recipe_id: str | None = None

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("must be 64 lowercase hex digits")
        return v
