"""Where the suite may write: its own temp root, and a home of its own in place of the real user's.

``conftest`` calls :func:`isolate` before it imports huggingface_hub or rigsmith. Everything that reads ``~``
then reads the suite's home: rigsmith's home rule (:func:`rigsmith.userhome.invoking_home`: ``$HOME``, or
``SUDO_USER``'s home when root runs under sudo, so ``SUDO_USER`` is dropped), ``Path.home()``,
``os.path.expanduser``, the XDG base directories, and the tools the tests spawn (podman, git, ray, invoke).
``TMPDIR`` is a short directory of the suite's under /tmp, removed with the home at the end of the run. The
runner's terminal size (``COLUMNS``, ``LINES``) is dropped as well.
xdist workers inherit the controller's environment, so every worker of one run shares one home. A test that
needs a ``~/…`` path to exist makes it under ``Path.home()`` (or renders with ``home=`` a tmp dir of its own).

Imports nothing from rigsmith: it runs before rigsmith is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: The environment variables carrying the suite's home and temp dir to xdist workers and spawned processes.
HOME_VAR = "RIGSMITH_TEST_HOME"
TMP_VAR = "RIGSMITH_TEST_TMPDIR"
#: XDG base directories, each put under the suite's home (a value from the real environment would point
#: at the real user's dirs).
XDG = {
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}


def temp_root(repo: Path) -> Path:
    """One temp root per checkout (``PYTEST_DEBUG_TEMPROOT``): concurrent pytest runs from several worktrees
    must not prune each other's temp dirs (pytest keeps only the newest few under a shared root)."""
    default = Path("/tmp") / f"rs-pytest-{hashlib.sha256(str(repo).encode()).hexdigest()[:8]}"
    root = Path(os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(default)))
    root.mkdir(parents=True, exist_ok=True)
    return root


def isolate(root: Path) -> list[Path]:
    """Point this process's home and temp dir at the suite's (made unless an xdist controller already made
    them); return what this call made (its maker removes them at the end of the run)."""
    made: list[Path] = []
    home = os.environ.get(HOME_VAR)
    if not home:
        real = os.environ.get("HOME")
        # pyenv's shims find their root under $HOME when PYENV_ROOT is unset: keep them working.
        if real and "PYENV_ROOT" not in os.environ and (Path(real) / ".pyenv").is_dir():
            os.environ["PYENV_ROOT"] = str(Path(real) / ".pyenv")
        home = tempfile.mkdtemp(prefix="home-", dir=root)
        # TMPDIR: short (a podman runroot must stay under 50 characters, a socket path under 108) and the
        # suite's own, for what the tests and the tools they run put in "the" temp dir: Jinja's compiled
        # templates, containers/image's big files (else /var/tmp), Python's tempfile.
        tmp = tempfile.mkdtemp(prefix="rs-tmp-", dir="/tmp")
        os.environ.update({HOME_VAR: home, TMP_VAR: tmp})
        made += [Path(home), Path(tmp)]
    os.environ["HOME"] = home
    os.environ["TMPDIR"] = os.environ[TMP_VAR]
    tempfile.tempdir = None  # read TMPDIR again
    for var, sub in XDG.items():
        os.environ[var] = str(Path(home) / sub)
    os.environ.pop("SUDO_USER", None)
    # Nor the runner's terminal: an xdist worker inherits COLUMNS=80, and a CLI test reads a table as a user
    # without a terminal gets it (shutil.get_terminal_size's fallback width).
    for var in ("COLUMNS", "LINES"):
        os.environ.pop(var, None)
    return made


@contextlib.contextmanager
def default_sigint() -> Iterator[None]:
    """Spawn children as a shell does for a foreground command: SIGINT at its default and unblocked, whatever
    this (test worker) process holds now; an ignored SIGINT and a blocked one are inherited across exec, and a
    Python child then never raises KeyboardInterrupt. Main thread only."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if before is not None:
            signal.signal(signal.SIGINT, before)
