"""A closed stdout pipe is a normal end: ``rigsmith --help | head -1`` and ``invoke --list | head -1`` stop
quietly with status 141 (128 + SIGPIPE, what a shell reports for a command SIGPIPE ended), no traceback.

Invoke prints --list and --help itself, with no hook of its own, so two of Python's documented hooks catch
the failed write: the excepthook (a write that failed while printing) and atexit (the last flush of buffered
output). A task's own output is caught where tasks catch errors (rigsmith.cli.wiring.user_errors).
"""

from __future__ import annotations

import atexit
import os
import select
import sys
from types import TracebackType
from typing import NoReturn

#: The exit status of a command whose reader went away (128 + SIGPIPE), as a shell reports a killed one.
BROKEN_PIPE = 141


def reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``| head`` that had its lines)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poll.poll(0))
    except (AttributeError, ValueError, OSError):  # no stdout, a closed one, a stream with no descriptor
        return False


def quiet_stdout() -> None:
    """Python's documented recipe ("Note on SIGPIPE", the signal module): stdout onto /dev/null, so the
    interpreter's last flush fails on nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def end_for_a_gone_reader() -> NoReturn:
    """Stdout quiet, then status 141 at once: reached only from the hooks, after Invoke's own printing
    (a task's output ends through Exit, with the interpreter's clean-up)."""
    quiet_stdout()
    sys.stderr.flush()
    os._exit(BROKEN_PIPE)


_installed = False


def end_quietly_when_the_reader_goes() -> None:
    """Make an uncaught BrokenPipeError on a stdout whose reader went away end the command quietly: Invoke
    prints --list and --help TASK itself, with no hook of its own. Two of Python's documented hooks: the
    excepthook (a write that failed while printing) and atexit (the last flush of buffered output). Any
    other uncaught exception goes to the hook that was there."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if isinstance(value, BrokenPipeError) and reader_gone():
            end_for_a_gone_reader()
        previous(kind, value, tb)

    def last_flush() -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            end_for_a_gone_reader()
        except (AttributeError, ValueError):  # no stdout, or a closed one: nothing to flush
            pass

    sys.excepthook = hook
    atexit.register(last_flush)
