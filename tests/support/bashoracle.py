"""bash as the oracle for argv: a text runs under ``bash`` with stub launchers that write their argv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.common import require

#: Launchers print their argv; wrappers run what they wrap; what changes the host does nothing.
STUBS = """
set -f
_argv() { printf '%s\\0' "$@" > "$ARGV_OUT"; }
vllm() { _argv vllm "$@"; }
python() { _argv python "$@"; }
python3() { _argv python3 "$@"; }
docker() { _argv docker "$@"; }
podman() { _argv podman "$@"; }
sudo() { "$@"; }
nohup() { "$@"; }
exec() { "$@"; }
tee() { cat > /dev/null; }
cd() { :; }
source() { :; }
conda() { :; }
"""


def bash_argv(text: str, tmp_path: Path) -> list[str]:
    """The argv bash hands the (stubbed) launcher when it runs ``text`` in ``tmp_path`` (HOME too)."""
    bash = require("bash")
    out = tmp_path / "argv"
    out.unlink(missing_ok=True)
    env = {"PATH": os.environ["PATH"], "ARGV_OUT": str(out), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [bash, "--noprofile", "--norc", "-c", STUBS + text + "\nwait\n"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes().decode().split("\0")[:-1]
