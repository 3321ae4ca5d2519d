"""A record's ``Env:`` list in shorthand (``PLE mmap, BREAKABLE_CUDAGRAPH=0, QSA_KV_OFFLOAD=1 (MAX_GIB 56,
ARENA 100663296), expandable_segments``) read into variables. Pure.

Each item is, in this order: mapped by a rule of :data:`recordtables.ENV_RULES` (the variable's note names
the rule); written as the record states it when it is a full name (``VLLM_…``, ``PYTORCH_…``); or a guess —
a name without its prefix (``QSA_KV_OFFLOAD=1`` → ``VLLM_QSA_KV_OFFLOAD``, its parenthesis ``MAX_GIB 56`` →
``VLLM_QSA_KV_OFFLOAD_MAX_GIB``) or a word a guess rule expands — which is asked; unanswered, the guessed
variable's value is a placeholder (deploy refuses until the user fills it). A word with no rule is asked
with no default; unanswered it is listed in ``not_taken``.
"""

from __future__ import annotations

import re
import shlex

from rigsmith import spec as specmod
from rigsmith.importing.recipe.record import tables as t
from rigsmith.importing.recipe.record.ask import Ask, Reading, top_split

_ASSIGN_RE = re.compile(r"(?P<name>[A-Za-z_]\w*)=(?P<value>\S+)(?:\s*\((?P<subs>[^)]*)\))?")
_SUB_RE = re.compile(r"(?P<key>[A-Za-z_]\w*)\s*[= ]\s*(?P<value>\S+)")


def read_env(r: Reading, text: str, files: list[str]) -> None:
    """The ``Env:`` items of ``text`` into ``r.env`` (``files``: the file mounts, named in the questions)."""
    r.env_notes.append(f"Env, as the record writes it: {text}")
    for item in top_split(text):
        _item(r, item.strip(), files)


def _item(r: Reading, item: str, files: list[str]) -> None:
    m = _ASSIGN_RE.fullmatch(item)
    word = m.group("name") if m else item
    rule = next((x for x in t.ENV_RULES if x.word.lower() == word.lower()), None)
    stated = m.group("value") if m else None
    subs = _subs(m.group("subs") or "") if m else []
    if rule is not None and not rule.guess:
        pairs = [(n, v if v is not None else stated or "1") for n, v in rule.names]
        pairs += [(f"{pairs[0][0]}_{k}", v) for k, v in subs]
        _add(r, pairs, f"record: {item} → by rule: {rule.source}")
        return
    if m is not None and word.startswith(t.KNOWN_PREFIXES):
        _add(r, [(word, stated or ""), *((f"{word}_{k}", v) for k, v in subs)], f"record: {item} (as stated)")
        return
    if rule is not None:
        guess = [(n, v if v is not None else stated or "1") for n, v in rule.names]
        why = rule.source
    elif m is not None:
        name = t.GUESSED_PREFIX + word
        guess = [(name, stated or ""), *((f"{name}_{k}", v) for k, v in subs)]
        why = f"a guess: the record drops the {t.GUESSED_PREFIX} prefix its patched vLLM's variables carry"
    else:
        guess, why = [], "no rule names the variable behind it"
    _asked(r, item, word, guess, why, files)


def _subs(text: str) -> list[tuple[str, str]]:
    """A parenthesis of sub-settings, ``MAX_GIB 56, ARENA 100663296`` → [(MAX_GIB, 56), (ARENA, …)]."""
    return [(s.group("key"), s.group("value")) for x in top_split(text) if (s := _SUB_RE.fullmatch(x))]


def _asked(
    r: Reading, item: str, word: str, guess: list[tuple[str, str]], why: str, files: list[str]
) -> None:
    shown = " ".join(f"{n}={v}" for n, v in guess)
    mounts = f" (the record's file mounts: {', '.join(files)})" if files else ""
    answer = r.ask(
        Ask(
            f"env.{word}",
            f"the record's env item '{item}' is shorthand ({why}); the NAME=VALUE words it stands "
            f"for{mounts}",
            default=shown or None,
            guess=True,
        )
    )
    if answer is not None:
        pairs = []
        for w in shlex.split(answer):
            name, eq, value = w.partition("=")
            if not eq or not specmod.ENV_NAME_RE.match(name):
                r.problems.append(
                    f"answer env.{word}: {w!r} is not NAME=VALUE; write the variables as NAME=VALUE"
                )
                return
            pairs.append((name, value))
        _add(r, pairs, f"record: {item} → answered at import")
        return
    if not guess:
        r.skip(item, f"env shorthand that {why}; answer env.{word} with the NAME=VALUE words it stands for")
        return
    tokens = [
        f"<{word}>" if i == 0 else f"<{word} {n.removeprefix(guess[0][0] + '_')}>"
        for i, (n, _) in enumerate(guess)
    ]
    for (name, value), tok in zip(guess, tokens, strict=True):
        r.placeholders[tok] = None
        r.env.append(
            specmod.EnvVar(
                name=name,
                value=tok,
                note=f"record: {item} → {why}; unanswered: check the name, then fill placeholders "
                f"{tok!r} with the record's value {value!r}",
            )
        )


def _add(r: Reading, pairs: list[tuple[str, str]], note: str) -> None:
    for name, value in pairs:
        r.env.append(specmod.EnvVar(name=name, value=value, note=note))
