"""The bench gate and the --diff value, as pure functions."""

from __future__ import annotations

import pytest

from rigsmith.cli.history import lock_numbers
from rigsmith.errors import RigsmithError
from rigsmith.operating.upgrade.upgrade import regressions


def _run(tps: float, ttft: float) -> dict[str, float]:
    return {"streams": 1, "mean_stream_decode_tps": tps, "ttft_mean_s": ttft}


@pytest.mark.parametrize(
    ("new", "named"),
    [
        (_run(181.0, 0.100), []),  # 9.5 % slower: inside 10 %
        (_run(179.0, 0.100), ["decode 179.0 tok/s vs 200.0 (-10%, threshold -10%)"]),
        (_run(200.0, 0.120), []),  # +20 % TTFT but only 20 ms: noise on a busy host
        (_run(200.0, 0.130), ["TTFT 130 ms vs 100 ms (+30%, threshold +10%)"]),
        (_run(140.0, 0.300), ["decode 140.0 tok/s vs 200.0 (-30%, threshold -10%)", "TTFT 300 ms vs 100 ms"]),
    ],
)
def test_a_regression_is_named_only_beyond_the_threshold(new: dict[str, float], named: list[str]) -> None:
    got = regressions(_run(200.0, 0.100), new, 0.10)
    assert len(got) == len(named) and all(g.startswith(n) for g, n in zip(got, named, strict=True)), got


def test_the_threshold_is_the_users() -> None:
    assert regressions(_run(200.0, 0.1), _run(150.0, 0.1), 0.30) == []


@pytest.mark.parametrize(
    ("text", "want"), [("3", (3, None)), ("2 5", (2, 5)), ("2,5", (2, 5)), ("2..5", (2, 5))]
)
def test_diff_takes_one_or_two_numbers(text: str, want: tuple[int, int | None]) -> None:
    assert lock_numbers(text) == want


@pytest.mark.parametrize("text", ["", "x", "1 2 3", "-1", "1.5"])
def test_a_bad_diff_value_is_one_clear_error(text: str) -> None:
    with pytest.raises(RigsmithError, match="not one or two lock numbers"):
        lock_numbers(text)
