"""A pasted script run by GNU bash itself, jailed, to learn the command it launches (issue 35).

A subset of the shell written by hand is not bash and keeps differing from it; here bash does what bash
does. The text runs under ``bash -c`` inside bubblewrap: every namespace unshared (no network), an empty
environment, no controlling terminal, ``--die-with-parent``, only bash, the libraries it links and this
module's two scripts bound read-only, a small tmpfs as the working directory, limits on CPU time, memory,
processes and file size, and a wall clock kept here (the whole process group is killed at the end).

Inside, every command is a stub (``jail/stub.bash``, bound under each name; ``command_not_found_handle`` for
the rest): the launchers (``vllm``, ``python*``, ``docker``, ``podman``, ``ray``) record their argv and the
environment they were given, NUL-separated, on a descriptor read here; the wrappers (``sudo``, ``nohup``,
``env``, ``uv run``, ``bash -c``) record themselves and run what they wrap, so the innermost launcher's argv
is what is recorded (``exec`` needs nothing: bash execs the stub); any other command records itself and
prints a token in place of its output. ``jail/prelude.bash`` (bash's ``BASH_ENV``) sets ``set -u``, bash's
own trace (``PS4`` with a marker and ``$LINENO``) onto a second descriptor, and a DEBUG trap that tells the
stubs the line.

What is learned, by one rule each:

- a variable or positional parameter the text never sets is the placeholder ``<NAME>`` (``<1>``): bash
  reports it unbound, and the text runs again with that name set from that line on;
- a test, ``case``, loop or arithmetic that bash evaluated on a placeholder or on a command's output
  token is refused naming the line and the value (read from bash's trace, not from a parser here);
- a command outside the launchers: refused where its output token reaches a launcher's argv or env, a
  ``source`` of a file the text does not hold is refused, anything else is a note; the text runs once with
  those commands succeeding and once failing: a launch that differs is refused, one that only one run
  reaches (a guard, ``set -e``) is imported from that run with a note;
- the run is bounded: 4 s of wall clock (and of CPU), 128 MiB of memory a process, 32 processes at once
  (200 started in all), 4 MiB files, 4 MiB read back per descriptor; at the end bash waits for every
  process it started, so a detached fork bomb runs into the wall clock, and the host waits until the
  jail's init is gone;
- ``$HOME`` and ``~`` are ``~`` (the invoking user's home, as every target writes it out); the directory
  the recipe runs in is ``.``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rigsmith.digits import ascii_digits
from rigsmith.errors import shown
from rigsmith.importing import blanks
from rigsmith.importing.jailread import (
    _DECIDING,
    _NUL,
    _RESERVED,
    _TOKEN_RE,
    Answer,
    Call,
    _answer,
    _exe,
    _launched,
    _State,
    _trace,
    named,
)
from rigsmith.importing.jailrun import JailUnavailable, _once, _Run, _spelled, unavailable
from rigsmith.importing.unknown import placeholder
from rigsmith.secretenv import is_secret_name

__all__ = ["Answer", "Call", "JailUnavailable", "named", "run", "unavailable"]

#: Bounds: all runs together (s), runs, the text's size.
TOTAL_SECONDS = 8.0
MAX_RUNS = 12
MAX_TEXT = 100 << 10  # one argv word of bash (the kernel takes 128 KiB)


def run(text: str) -> Answer:
    """What bash does with ``text``, run in the jail (raises :class:`JailUnavailable` where it cannot)."""
    why = unavailable()
    if why is not None:
        raise JailUnavailable(why)
    if len(text.encode()) > MAX_TEXT or _NUL in text:
        return Answer(problems=[f"the text is over {MAX_TEXT >> 10} KiB (or holds U+E000); not a recipe"])
    text = text.replace("\0", _NUL)  # bash's words cannot hold NUL: carried through, restored after
    deadline = time.monotonic() + TOTAL_SECONDS
    state = _State()
    state.empty_defaults(text)
    for _ in range(MAX_RUNS):
        got = _once(text, state.positional, state.gate_list(), state.mounts(), deadline)
        if got.status is None or got.overflow or not state.learn(got.errors, _trace(got.trace)):
            break
    answer = _answer(got, state)
    if answer.calls and not answer.problems:
        got, answer = _blanks(text, state, got, answer, deadline)
    if not answer.problems and state.names():
        answer.problems += _derived(text, state, got, deadline)
    if answer.outside and not answer.problems:
        # The commands rigsmith does not run succeeded; run again with them failing: where that changes
        # what is launched, bash decided on their exit status.
        other = _once(text, state.positional, state.gate_list(), state.mounts(), deadline, exit_status=1)
        answer = _on_status(answer, _answer(other, state))
    return answer


def _blanks(text: str, state: _State, got: _Run, answer: Answer, deadline: float) -> tuple[_Run, Answer]:
    """The text run again with each name it assigns only the empty string filled, after that, with its
    placeholder (:mod:`rigsmith.importing.blanks`): those that then stand as a flag's value bash left
    without one are the text's blanks, and the run with only them filled is the answer."""
    candidates = blanks.empty_assigned(_trace(got.trace), [*_RESERVED, *state.names()])
    if not candidates:
        return got, answer
    state.blanks = list(candidates)
    trial = _once(text, state.positional, state.gate_list(), state.mounts(), deadline)
    found = blanks.blanks(
        candidates, [c.argv for c in answer.calls], [c.argv for c in _answer(trial, state).calls]
    )
    state.blanks = list(found)
    if not found or trial.status is None:
        state.blanks = []
        return got, answer
    if len(found) < len(candidates):
        trial = _once(text, state.positional, state.gate_list(), state.mounts(), deadline)
    out = _answer(trial, state)
    out.notes += [blanks.note(n, line, flag, is_secret_name(n)) for n, (line, flag) in found.items()]
    out.blanks = found
    return trial, out


def _signature(got: _Run, varied: Sequence[str]) -> list[tuple[int, str, str]]:
    """What bash decided and launched in a run, in order (line, kind, words): each placeholder spelled back
    as ``<NAME>``, each command's output as one token."""

    def back(text: str) -> str:
        for name in varied:
            text = text.replace(_spelled(name, varied), placeholder(name))
        return _TOKEN_RE.sub("@@output@@", text)

    out = [(line, "T", back(cmd)) for line, cmd in _trace(got.trace) if cmd.startswith(_DECIDING)]
    for kind, line, *rest in got.records:
        if kind == "L" and _launched(rest):
            out.append(
                (int(line) if ascii_digits(line) else 0, "L", back(" ".join([_exe(rest[1]), *rest[2:]])))
            )
        elif kind == "D":  # a case word: its value, then the command
            out.append((int(line) if ascii_digits(line) else 0, "T", back(" ".join([*rest[1:2], *rest[:1]]))))
    return out + [(line, "E", back(message)) for line, message in got.errors]


def _derived(text: str, state: _State, got: _Run, deadline: float) -> list[str]:
    """Refusals where bash decided on (or launched) a value made from a placeholder — its length, a part of
    it, arithmetic on it (``${#1}``, ``${1:0:3}``): bash's own account of the run differs when the
    placeholder is spelled otherwise. Each such placeholder is named, with the line of the first
    difference."""
    names = sorted(state.names())
    want = _signature(got, ())

    def differs(varied: Sequence[str]) -> tuple[int, str, str] | None:
        other = _once(text, state.positional, state.gate_list(), state.mounts(), deadline, varied=varied)
        seen = _signature(other, varied)
        if other.status is None:
            return None  # out of time: the runs before decided what is imported
        for a, b in zip(want, seen, strict=False):
            if a != b:
                return a
        if len(want) != len(seen):
            return max(want, seen, key=len)[min(len(want), len(seen))]
        return None

    if differs(names) is None:
        return []
    out = []
    for name in names:
        found = differs(names if len(names) == 1 else [name])
        if found is None:
            continue
        line, kind, cmd = found
        verb = "launches with" if kind == "L" else "decides on"
        out.append(
            f"line {line}: bash {verb} a value made from the placeholder {placeholder(name)} (its length, "
            f"a part of it or arithmetic on it: {shown(cmd[:200])}), which the text does not give; write "
            "the value out (or remove the test)"
        )
    return out or [
        f"bash decides on a value made from the placeholders {', '.join(placeholder(n) for n in names)} "
        "(their length, a part of one or arithmetic on one), which the text does not give; write the "
        "values out"
    ]


def _on_status(succeeded: Answer, failed: Answer) -> Answer:
    """One answer from the runs where the outside commands succeeded and failed."""
    ran = "; ".join(f"line {line}: {named(argv)}" for line, argv in succeeded.outside)
    if failed.problems or [c.argv for c in succeeded.calls] == [c.argv for c in failed.calls]:
        return succeeded
    if succeeded.calls and failed.calls:
        succeeded.problems.append(
            f"what the text launches depends on whether commands rigsmith does not run succeed ({ran}); "
            "remove the test on them, or keep the launch command"
        )
        return succeeded
    chosen, when = (succeeded, "succeed") if succeeded.calls else (failed, "fail")
    chosen.notes.append(
        f"the text launches its command only when commands rigsmith does not run {when} ({ran}): a check "
        "on them (or set -e) stops the script on the machine otherwise; imported as the run where they "
        + when
    )
    return chosen
