"""voxpipe/voxcpm2_format.py: the checkpoint check every step asks, and its one-paragraph error."""

from __future__ import annotations

import pytest

from voxpipe.errors import StepError
from voxpipe.voxcpm2_format import checkpoint_config, is_checkpoint


def test_a_folder_with_config_json_is_a_checkpoint(tmp_path):
    assert not is_checkpoint(tmp_path) and not is_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text("{}")
    assert is_checkpoint(str(tmp_path)) and checkpoint_config(tmp_path) == tmp_path / "config.json"


def test_the_error_names_the_folder_or_the_setting_and_the_way_out(tmp_path):
    with pytest.raises(StepError) as plain:
        checkpoint_config(tmp_path)
    assert str(plain.value) == f"{tmp_path}: not a VoxCPM2 checkpoint (no config.json)"
    with pytest.raises(StepError) as told:
        checkpoint_config(tmp_path, where="serve --base x", way_out="run `voxpipe init-model`")
    assert str(told.value) == ("serve --base x: not a VoxCPM2 checkpoint (no config.json); "
                               "run `voxpipe init-model`")
