"""One run of a text by GNU bash in the import jail (issue 35), for :mod:`rigsmith.importing.bashjail`.

bubblewrap's argv (every namespace unshared, an empty environment, no controlling terminal,
``--die-with-parent``, only bash, the libraries it links and ``jail/prelude.bash`` / ``jail/stub.bash``
bound read-only, a small tmpfs as the working directory), the limits set before it starts (CPU time,
memory, file size, no root), the descriptors the stubs and bash's trace write read back within the wall
clock, and the wait until the jail's init is gone. What bash's answers mean is
:mod:`rigsmith.importing.jailread`'s.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rigsmith.errors import shown
from rigsmith.importing.unknown import placeholder

_FILES = Path(__file__).with_name("jail")
#: Names the stub is bound under on the jail's PATH.
STUB_NAMES = (
    "vllm",
    "python",
    "python3",
    "docker",
    "podman",
    "ray",
    "sudo",
    "nohup",
    "env",
    "uv",
    "bash",
    "sh",
)
#: The directory the recipe runs in, inside the jail; written ``.`` in what is handed on.
CWD = "/.rigsmith-recipe-dir"
_BASH = "/usr/bin/bash"
#: Bounds: one run's wall clock (s), bytes read back per descriptor.
RUN_SECONDS = 4.0
MAX_OUTPUT = 4 << 20
#: How the run that looks for decisions on values made from a placeholder spells it, longer at both ends
#: (``<~1~>``): a length, a prefix or a suffix of it differs from the first run's.
VARIED = "~"
_ERR_RE = re.compile(r"^(?:\S*bash|sh): (?:line (\d+): )?(.*)$")


class JailUnavailable(Exception):
    """bubblewrap is not installed or cannot make its namespaces here."""


@dataclass
class _Run:
    """The raw outcome of one run in the jail."""

    records: list[list[str]]
    trace: str
    errors: list[tuple[int, str]]
    status: int | None  # None: killed at the wall clock
    overflow: bool = False


def bwrap() -> str | None:
    """The bubblewrap binary, or None."""
    return shutil.which("bwrap")


@functools.cache
def _probe(binary: str) -> str | None:
    """Why bubblewrap cannot run here (None when it can): it is tried once per process."""
    try:
        proc = subprocess.run(
            [*_bwrap_argv(binary, [], ()), "-c", "exit 0"],
            preexec_fn=_limits,
            env={},
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()[:300]


def unavailable() -> str | None:
    """Why the jail cannot run here, in words; None when it can."""
    binary = bwrap()
    if binary is None:
        return "bubblewrap (bwrap) is not installed"
    why = _probe(binary)
    return None if why is None else f"bubblewrap cannot make its namespaces here ({shown(why)})"


def _limits() -> None:
    """In the child before bwrap: bounds on memory, CPU, file size, and no root (a fork bomb's process
    count is bounded inside, where ``ulimit -u`` counts the jail's own user namespace)."""
    for what, value in (
        (resource.RLIMIT_AS, 1 << 30),
        (resource.RLIMIT_CPU, 6),
        (resource.RLIMIT_FSIZE, 8 << 20),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 1024),
    ):
        resource.setrlimit(what, (value, value))
    if os.geteuid() == 0:  # root's processes are exempt from the process limit: run as nobody
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


def _libraries(binary: str) -> list[str]:
    """The shared libraries ``binary`` loads (ldd's paths), for binding into the jail."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    return re.findall(r"(?:=>\s*)?(/\S+)\s+\(0x", out)


@functools.cache
def _base_binds() -> tuple[str, ...]:
    binds = ["--ro-bind", _BASH, _BASH]
    for lib in _libraries(_BASH):
        binds += ["--ro-bind", os.path.realpath(lib), lib]
    binds += ["--ro-bind", str(_FILES / "prelude.bash"), "/rs/prelude.bash"]
    for name in STUB_NAMES:
        binds += ["--ro-bind", str(_FILES / "stub.bash"), f"/rs/bin/{name}"]
    return tuple(binds)


def _bwrap_argv(binary: str, env: Sequence[str], extra: Sequence[str]) -> list[str]:
    argv = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    argv += _base_binds()
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(8 << 20), "--tmpfs", CWD]
    argv += list(extra)
    # /dev is bubblewrap's own tmpfs, of no size limit (its device nodes are mounts of their own and stay
    # writable): read-only, a text cannot fill the host's memory through /dev/shm
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", CWD]
    base = {"PATH": "/rs/bin", "HOME": "~", "BASH_ENV": "/rs/prelude.bash"}
    for name, value in base.items():
        argv += ["--setenv", name, value]
    argv += list(env)
    return [*argv, "--", _BASH, "--norc", "--noprofile"]


def _read_all(
    proc: subprocess.Popen[bytes], fds: dict[int, str], deadline: float
) -> tuple[dict[str, bytes], bool]:
    """Everything the jail writes on ``fds`` until they close or the deadline; whether it overflowed."""
    got = {name: bytearray() for name in fds.values()}
    overflow = False
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                name = fds[key.fd]
                if not chunk:
                    sel.unregister(key.fd)
                elif len(got[name]) + len(chunk) > MAX_OUTPUT:
                    overflow = True
                    return {k: bytes(v) for k, v in got.items()}, overflow
                else:
                    got[name] += chunk
    return {k: bytes(v) for k, v in got.items()}, overflow


def _once(
    text: str,
    positional: int,
    gates: Sequence[str],
    mounts: Sequence[str],
    deadline: float,
    exit_status: int = 0,
    varied: Sequence[str] = (),
) -> _Run:
    binary = bwrap()
    assert binary is not None
    rec_r, rec_w = os.pipe()
    xt_r, xt_w = os.pipe()
    info_r, info_w = os.pipe()
    extra = ["--info-fd", str(info_w), *mounts]
    env = ["--setenv", "__RS_RFD", str(rec_w), "--setenv", "__RS_XFD", str(xt_w)]
    env += ["--setenv", "__RS_STATUS", str(exit_status)]
    if gates:
        env += ["--setenv", "__RS_PH", " ".join(gates)]
    if varied:
        env += ["--setenv", "__RS_ALT", " ".join(varied), "--setenv", "__RS_VARIED", VARIED]
    argv = [*_bwrap_argv(binary, env, extra), "-c", text, "bash"]
    argv += [_spelled(str(i), varied) for i in range(1, positional + 1)]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(rec_w, xt_w, info_w),
        preexec_fn=_limits,
        start_new_session=True,
        env={},  # bubblewrap is the jail's pid 1: its environment is the text's to read in /proc/1/environ
    )
    for fd in (rec_w, xt_w, info_w):
        os.close(fd)
    assert proc.stderr is not None
    streams = {rec_r: "rec", xt_r: "trace", info_r: "info", proc.stderr.fileno(): "err"}
    got: dict[str, bytes] = {}
    try:
        ends = min(deadline, time.monotonic() + RUN_SECONDS)
        got, overflow = _read_all(proc, streams, ends)
        try:
            status: int | None = proc.wait(timeout=0 if overflow else max(0.0, ends - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = None
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = None
            _gone(got.get("info", b""))
        for fd in (rec_r, xt_r, info_r):
            os.close(fd)
        proc.stderr.close()
    errors = []
    for raw in got["err"].decode(errors="replace").splitlines():
        if m := _ERR_RE.match(raw):
            errors.append((int(m.group(1) or 0), m.group(2)))
    return _Run(_records(got["rec"]), got["trace"].decode(errors="replace"), errors, status, overflow)


def _gone(info: bytes) -> None:
    """Wait until the jail's init (``child-pid`` of bwrap's info) has exited: the kernel ends every other
    process of its namespace first, so when it is gone, nothing the text started is left."""
    m = re.search(rb'"child-pid":\s*(\d+)', info)
    if m is None:
        return
    status = Path("/proc", m.group(1).decode(), "stat")
    ends = time.monotonic() + 5
    while time.monotonic() < ends:
        try:
            state = status.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)


def _records(data: bytes) -> list[list[str]]:
    """The records the stubs wrote: each ``[kind, line, field…]``."""
    fields = data.decode(errors="replace").split("\0")[:-1]
    out: list[list[str]] = []
    i = 0
    while i + 2 < len(fields):
        try:
            count = int(fields[i + 2])
        except ValueError:
            break
        out.append([fields[i], fields[i + 1], *fields[i + 3 : i + 3 + count]])
        i += 3 + count
    return out


def _spelled(name: str, varied: Sequence[str]) -> str:
    """The placeholder of ``name`` as a run spells it (``<1>``, or ``<~1~>`` where it is varied)."""
    return placeholder(f"{VARIED}{name}{VARIED}" if name in varied else name)
