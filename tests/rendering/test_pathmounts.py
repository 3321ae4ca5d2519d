"""A flag's path given through a placeholder is mounted once filled with an absolute path (rendering/
pathmounts); what is already inside a mount, a Hub id and a relative fill are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.rendering.pathmounts import FilledPath, filled_paths
from tests.support.common import standin_deployment


def _spec(tmp_path: Path, args: list[str], placeholders: dict[str, str]) -> specmod.Deployment:
    data = standin_deployment(tmp_path, mounts=[], placeholders=placeholders)
    data["engine"]["args"] = ["Qwen/Qwen3-0.6B", *args]  # type: ignore[index]
    return specmod.Deployment.model_validate(data)


@pytest.mark.parametrize(
    ("args", "fill", "want"),
    [
        (["--chat-template", "<T>"], "/srv/t.jinja", [FilledPath("/srv/t.jinja", True, "file")]),
        (["--chat-template", "<T>/t.jinja"], "/srv", [FilledPath("/srv/t.jinja", True, "file")]),
        (["--lora-modules", "sql=<T>"], "/srv/sql/", [FilledPath("/srv/sql", True, "dir")]),
        (
            ["--lora-modules", "sql=<T>", "--chat-template", "<T>/t.jinja"],
            "/srv",
            [FilledPath("/srv", True, "dir")],
        ),
        (["--lora-modules", "sql=<T>"], "org/sql-lora", []),  # a Hub id: a secondary model, no path
        (["--chat-template", "<T>"], "t.jinja", []),  # relative: the plan's checks name it
        (["--chat-template", "<T>"], "/models/Qwen3-0.6B/t.jinja", []),  # inside the model's mount
        (["--chat-template", "/srv/t.jinja"], "", []),  # no placeholder: the import mounted it
    ],
)
def test_a_filled_flag_path_is_mounted_at_itself_unless_a_mount_holds_it(
    tmp_path: Path, args: list[str], fill: str, want: list[FilledPath]
) -> None:
    spec = _spec(tmp_path, args, {"<T>": fill} if "<T>" in " ".join(args) else {})
    assert filled_paths(spec, ["/models/Qwen3-0.6B"]) == want
