"""One row of doctor's go/no-go table (doctor, its podman checks and the fit report build them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["go", "warn", "no-go"]


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    verdict: Verdict
    detail: str
    hint: str | None = None
