"""The serving stand-in image (busybox + Python + rigsmith's OpenAI stand-in), imported once."""

from __future__ import annotations

import pytest

from tests.support.podman import Podman
from tests.support.upgrade import build_image


@pytest.fixture(scope="session")
def serving_image(podman: Podman, fake_cdi: object, tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(podman, tmp_path_factory.mktemp("serving-image"))
