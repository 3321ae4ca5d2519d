"""Which environment values rigsmith treats as secrets (rigsmith.secretenv), at the edges its docstring
draws: a value of exactly MIN_LENGTH characters, an absolute path that exists against any other text that
names a file, a name's TOKEN/KEY segment (issue 39's mutation sample; the import and writer paths are
tests/importing/test_secret_values.py)."""

from __future__ import annotations

import pytest

from rigsmith import secretenv


def test_a_value_of_exactly_the_minimum_length_is_a_secret_and_one_shorter_is_not() -> None:
    at, below = "k" * 8, "k" * 7  # the module's docstring: values shorter than 8 characters are not searched
    assert secretenv.values({"HF_TOKEN": at}) == {at: "HF_TOKEN"}
    assert secretenv.values({"HF_TOKEN": below}) == {}


def test_only_an_absolute_path_that_exists_is_passed_over() -> None:
    everything_exists = lambda _path: True  # noqa: E731
    nothing_exists = lambda _path: False  # noqa: E731
    env = {"SSL_KEY": "/etc/ssl/private/k.pem", "API_KEY": "relative/k.pem", "DB_PASSWORD": "hunter2hunter2"}
    assert secretenv.values(env, everything_exists) == {
        "relative/k.pem": "API_KEY",
        "hunter2hunter2": "DB_PASSWORD",
    }
    assert secretenv.values(env, nothing_exists)["/etc/ssl/private/k.pem"] == "SSL_KEY"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("hf_token_ro", True),
        ("TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("KEY_FILE", True),
        ("MYSQL_PASSWD", True),
        ("client_secret", True),
        ("AWS_CREDENTIALS_FILE", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD", False),
        ("MONKEY", False),
        ("HF_HOME", False),
    ],
)
def test_a_secret_is_named_by_a_token_or_key_segment_or_a_secret_word(name: str, secret: bool) -> None:
    assert secretenv.is_secret_name(name) is secret


def test_a_value_held_by_two_names_is_named_by_the_first_and_a_text_lists_each_name_once() -> None:
    value = "s3cr3t-value"
    secrets = secretenv.values({"Z_TOKEN": value, "A_KEY": value, "B_SECRET": "other-long-one"})
    assert secrets == {value: "A_KEY", "other-long-one": "B_SECRET"}
    text = f"--x {value} --y {value} other-long-one"
    assert secretenv.carried(text, secrets) == ["A_KEY", "B_SECRET"]
    assert secretenv.carried("nothing here", secrets) == []


def test_a_value_that_cannot_be_a_path_on_this_host_is_still_a_secret() -> None:
    """A NUL makes the host's path check fail (ValueError): no file to mount, so the value is kept."""
    value = "/not-a-path\0really-a-token"
    assert secretenv.values({"HF_TOKEN": value}) == {value: "HF_TOKEN"}
