"""What doctor's checks share (doctor, its podman checks and the fit report build on it): one row of the
go/no-go table, and the GPUs a spec asks for on this host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rigsmith.digits import ascii_digits
from rigsmith.resolving.fit.fitverdict import Verdict as Verdict  # one verdict word set: doctor's and fit's

if TYPE_CHECKING:
    from rigsmith.operating.probes import HostFacts
    from rigsmith.spec import Deployment


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    verdict: Verdict
    detail: str
    hint: str | None = None


def requested_gpus(spec: Deployment, facts: HostFacts) -> list[int]:
    """Indices of the GPUs the spec's CDI devices name ('all' = every GPU found)."""
    names = [d.split("=", 1)[1] for d in spec.resources.gpus.cdi_devices]
    if "all" in names:
        return [g.index for g in facts.gpus] or list(range(spec.resources.gpus.count))
    out = []
    by_uuid = {g.uuid: g.index for g in facts.gpus}
    for n in names:
        if ascii_digits(n):
            out.append(int(n))
        elif n in by_uuid:
            out.append(by_uuid[n])
    return out
