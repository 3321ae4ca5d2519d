""".ci/fetch-test-tools downloads trixie's podman from the mirror this machine's apt already uses."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / ".ci" / "fetch-test-tools"


def _mirror(
    tmp_path: Path, sources_list: str | None, parts: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    for name, text in parts.items():
        (d / name).write_text(text)
    lst = tmp_path / "sources.list"
    if sources_list is not None:
        lst.write_text(sources_list)
    env = {**os.environ, "APT_SOURCES_PARTS": str(d), "APT_SOURCES_LIST": str(lst)}
    return subprocess.run(
        ["bash", str(SCRIPT), "--print-mirror"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("sources_list", "parts", "mirror"),
    [
        (
            None,
            {
                "debian.sources": "Types: deb\nURIs: http://security.debian.org/debian-security\n"
                "Suites: bookworm-security\nComponents: main\n\n"
                "Types: deb\n# a snapshot comment\nURIs: http://apt-cacher.lan:3142/debian/\n"
                "Suites: bookworm bookworm-updates\nComponents: main\n"
            },
            "http://apt-cacher.lan:3142/debian",
        ),
        (
            "# local mirror\ndeb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.lan/debian "
            "bookworm main\ndeb http://security.debian.org/debian-security bookworm-security main\n",
            {},
            "http://mirror.lan/debian",
        ),
        (
            "deb http://security.debian.org/debian-security bookworm-security main\n"
            "deb http://ftp.de.debian.org/debian/ bookworm main\n",
            {},
            "http://ftp.de.debian.org/debian",
        ),
    ],
)
def test_the_trixie_source_reuses_the_configured_debian_mirror(
    tmp_path: Path, sources_list: str | None, parts: dict[str, str], mirror: str
) -> None:
    out = _mirror(tmp_path, sources_list, parts)
    assert (out.returncode, out.stdout.strip()) == (0, mirror), out.stderr
    assert "deb.debian.org" not in SCRIPT.read_text()  # no mirror host hard-coded


def test_no_configured_source_is_a_clear_error(tmp_path: Path) -> None:
    out = _mirror(tmp_path, None, {})
    assert out.returncode == 1 and "no Debian source in" in out.stderr and "configure apt first" in out.stderr
