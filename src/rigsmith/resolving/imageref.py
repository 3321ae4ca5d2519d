"""Moved to :mod:`rigsmith.imageref` (the core: the importer checks a recipe's image with it too); these
names stay importable from here for code written before the move."""

from __future__ import annotations

from rigsmith.imageref import DIGEST_RE as DIGEST_RE
from rigsmith.imageref import DOCKER_HUB as DOCKER_HUB
from rigsmith.imageref import DOCKER_HUB_API as DOCKER_HUB_API
from rigsmith.imageref import ImageRef as ImageRef
from rigsmith.imageref import parse_ref as parse_ref
