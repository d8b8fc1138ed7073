"""`ksearch eval`'s launch plan file: errors are one line and name the target's own keys."""

from __future__ import annotations

import pytest

from ksearch.cli.eval_cmd import _launch_plan
from ksearch.errors import TaskError


def test_malformed_launch_yaml_is_one_line(tmp_path):
    (tmp_path / "k.launch.yaml").write_text("grid: [batch*dim\n")
    with pytest.raises(TaskError) as e:
        _launch_plan(tmp_path / "k.cu", None, "mlx-cuda")
    assert "\n" not in str(e.value) and "k.launch.yaml" in str(e.value)


@pytest.mark.parametrize("target, keys", [("mlx-cuda", "grid, threadgroup"), ("mlx-metal", "grid, threadgroup"),
                                          ("cuda", "launches")])
def test_a_launch_file_that_is_not_a_mapping_names_the_targets_keys(tmp_path, target, keys):
    """An mlx launch holds grid and threadgroup; the message named the cuda target's keys for every target."""
    (tmp_path / "k.launch.yaml").write_text("- 1\n")
    with pytest.raises(TaskError, match=keys):
        _launch_plan(tmp_path / "k.cu", None, target)
