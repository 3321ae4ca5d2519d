"""The deployment spec: ``deployments/NAME.yaml`` as frozen, validated models.

Everything a target renders comes from here (plus ``rigsmith.lock``). The models reject unknown fields,
collect every validation problem with its field path, and round-trip: ``load(dump(x)) == x``.

One module a section of the YAML: ``model`` (model, secondary_models), ``engine`` (engine, env),
``resources`` (resources, mounts), ``serving`` (readiness, network, benchmarks, proxy), ``provenance``
(provenance, not_taken), ``cluster``; ``deployment`` holds them together, ``fields`` is what they are built
from, ``placement`` is where secondary models live (the rules the spec refuses a layout by;
``rigsmith.secondary`` builds on them), and ``loading`` reads and writes a spec file (``load``, ``loads``,
``from_data``, ``dump``, ``to_data``, ``json_schema``). Import the names from here: ``from rigsmith import
spec``, ``spec.load(path)``.
"""

from __future__ import annotations

from rigsmith.spec.cluster import (
    ADDRESS_RE,
    DEFAULT_NODE_DIR,
    IFNAME_RE,
    NODE_DIR_RE,
    SSH_OPTION_KEYS,
    SSH_OPTIONS,
    Cluster,
    ClusterNode,
)
from rigsmith.spec.deployment import Deployment
from rigsmith.spec.engine import EngineSpec, EnvVar
from rigsmith.spec.fields import (
    CDI_RE,
    ENV_NAME_RE,
    HOST_REF_RE,
    HUB_REPO_RE,
    MAX_GPUS,
    NAME_RE,
    PLACEHOLDER_RE,
    SHA1_RE,
    SIZE_RE,
    SPEC_VERSION,
    Frozen,
    ascii_int,
    cdi_names,
    container_abs,
    hub_repo_id,
    matching,
    parse_size,
    repeated,
)
from rigsmith.spec.loading import MODELINE, dump, from_data, json_schema, load, loads, problems_from, to_data
from rigsmith.spec.model import ConfigPatch, ModelSpec, SecondaryModel
from rigsmith.spec.provenance import IMAGE_NOT_TAKEN, NotTaken, Provenance
from rigsmith.spec.resources import GpuSpec, Mount, Resources
from rigsmith.spec.serving import Benchmark, Network, Proxy, Readiness

__all__ = [
    "ADDRESS_RE",
    "CDI_RE",
    "DEFAULT_NODE_DIR",
    "ENV_NAME_RE",
    "HOST_REF_RE",
    "HUB_REPO_RE",
    "IFNAME_RE",
    "IMAGE_NOT_TAKEN",
    "MAX_GPUS",
    "MODELINE",
    "NAME_RE",
    "NODE_DIR_RE",
    "PLACEHOLDER_RE",
    "SHA1_RE",
    "SIZE_RE",
    "SPEC_VERSION",
    "SSH_OPTIONS",
    "SSH_OPTION_KEYS",
    "Benchmark",
    "Cluster",
    "ClusterNode",
    "ConfigPatch",
    "Deployment",
    "EngineSpec",
    "EnvVar",
    "Frozen",
    "GpuSpec",
    "ModelSpec",
    "Mount",
    "Network",
    "NotTaken",
    "Provenance",
    "Proxy",
    "Readiness",
    "Resources",
    "SecondaryModel",
    "ascii_int",
    "cdi_names",
    "container_abs",
    "dump",
    "from_data",
    "hub_repo_id",
    "json_schema",
    "load",
    "loads",
    "matching",
    "parse_size",
    "problems_from",
    "repeated",
    "to_data",
]
