"""bash as the oracle for argv: a text runs under ``bash`` with stub launchers that write their argv."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
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


#: A launcher on PATH that appends its argv (NUL-separated, one record a line) to $ARGV_OUT; a wrapper runs
#: what it wraps; a command that would wait (``sleep 60`` after a background server) returns at once.
_RECORDER = '#!/bin/bash\n{ printf "%s\\0" "${0##*/}" "$@"; printf "\\n"; } >> "$ARGV_OUT"\n'
_STUBS = {
    **dict.fromkeys(("vllm", "docker", "podman", "python", "python3"), _RECORDER),
    "nohup": '#!/bin/bash\nexec "$@"\n',
    "sleep": "#!/bin/bash\n",
}


def recording(tmp: Path, bodies: Mapping[str, str]) -> tuple[Path, Path, dict[str, str]]:
    """Stubs under ``tmp`` (name → script), the directory a text runs in, the file the recorders append to
    (emptied) and the environment that puts the stubs first on PATH."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, body in bodies.items():
        (stubs / name).write_text(body, encoding="utf-8")
        (stubs / name).chmod(0o755)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    out = tmp / "argv"
    out.unlink(missing_ok=True)
    return work, out, {"PATH": f"{stubs}:/usr/bin:/bin", "ARGV_OUT": str(out), "HOME": "~"}


def script_launches(
    text: str,
    tmp: Path,
    placeholders: Sequence[str] = (),
    outputs: Mapping[str, str] | None = None,
    blanks: Sequence[str] = (),
) -> list[list[str]]:
    """Every launcher argv plain bash (outside any jail, the real tools on PATH after the recorders) runs
    for ``text``, given the values rigsmith made placeholders: ``<NAME>`` in the environment, ``<N>`` as the
    positional parameters; ``outputs`` names commands that print a given value instead (the output rigsmith
    made a placeholder); ``blanks`` names variables the text assigns only the empty string, filled here
    with their placeholder by bash itself (``readonly NAME='<NAME>'`` before the text: the text's own empty
    assignments then fail and the value stays). The directory it runs in is written ``.``, ``$HOME`` is
    ``~``, as rigsmith writes them."""
    bash = require("bash")
    bodies = {
        **_STUBS,
        **{n: f"#!/bin/bash\nprintf '%s' {shlex.quote(v)}\n" for n, v in (outputs or {}).items()},
    }
    work, out, env = recording(tmp, bodies)
    names = [p[1:-1] for p in placeholders]
    env.update({n: f"<{n}>" for n in names if not n.isdigit()})
    count = max((int(n) for n in names if n.isdigit()), default=0)
    args = [f"<{i}>" for i in range(1, count + 1)]
    text = "".join(f"readonly {n}={shlex.quote(f'<{n}>')}\n" for n in blanks) + text
    for _ in range(4):  # a log the text writes into a directory of its machine: made, and run again
        out.unlink(missing_ok=True)
        proc = subprocess.run(
            [bash, "--norc", "--noprofile", "-c", text + "\nwait\n", "bash", *args],
            env=env,
            cwd=work,
            capture_output=True,
            timeout=30,
            check=False,
        )
        missing = re.findall(r"^bash: line \d+: ([^/\s][^:\s]*/[^:\s]+): No such file or directory$",
                             proc.stderr.decode(errors="replace"), re.M)  # fmt: skip
        made = [(work / m).parent for m in missing if ".." not in m and not (work / m).parent.exists()]
        if not made:
            break
        for d in made:
            d.mkdir(parents=True)
    records = out.read_bytes().split(b"\0\n")[:-1] if out.exists() else []
    here = str(work)
    return [[w.replace(here, ".") for w in r.decode().split("\0")] for r in records]
