"""The shipped demo base (data/demo-base): its checksums hold, it loads strictly, a damaged copy is refused
with a message naming the file, and the record of how it was made matches what its make script would use.

Remaking the base takes about half an hour on 2 cores, too slow for the suite: instead the script writes
its inputs to make_record.json and this test compares them with the script's own `inputs()`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys

import pytest

from tests.conftest import ROOT
from voxpipe.errors import StepError
from voxpipe.model.checksums import SUMS_FILE, read_sums
from voxpipe.model.config import preset
from voxpipe.model.encoder import load_encoder
from voxpipe.model.io import from_pretrained

BASE = ROOT / "data" / "demo-base"
MAX_BYTES = 20 * 1024 * 1024


def _make_script():
    spec = importlib.util.spec_from_file_location("make_demo_base", BASE / "make_demo_base.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_demo_base", module)
    spec.loader.exec_module(module)
    return module


def test_shipped_files_match_their_checksums_and_fit_the_size_limit():
    sums = read_sums(BASE)
    assert set(sums) == set(_make_script().SHIPPED)
    for name, digest in sums.items():
        assert hashlib.sha256((BASE / name).read_bytes()).hexdigest() == digest, name
    assert sum((BASE / name).stat().st_size for name in sums) <= MAX_BYTES


def test_base_loads_strictly_with_the_tiny_shape():
    model = from_pretrained(BASE)
    assert model.config.lm_config == preset("tiny").lm_config
    assert model.audio_vae is not None and model.tokenizer is not None
    assert load_encoder(BASE).patch_size == model.patch_size


@pytest.mark.parametrize("name, load", [("model.safetensors", from_pretrained),
                                        ("audiovae.safetensors", load_encoder)])
def test_a_damaged_copy_is_refused_naming_the_file(tmp_path, name, load):
    copy = tmp_path / "demo-base"
    shutil.copytree(BASE, copy)
    data = bytearray((copy / name).read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the last tensor: the shapes still fit
    (copy / name).write_bytes(bytes(data))
    message = rf"(?s){name.replace('.', '[.]')}: sha256 .*{SUMS_FILE}.*git checkout"
    with pytest.raises(StepError, match=message):
        load(copy)


def test_a_missing_listed_file_is_named(tmp_path):
    copy = tmp_path / "demo-base"
    shutil.copytree(BASE, copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(StepError, match=r"tokenizer\.json: listed in .*SHA256SUMS but missing"):
        from_pretrained(copy)


@pytest.mark.parametrize("load", [from_pretrained, load_encoder])
def test_sums_that_leave_out_the_weights_are_refused(tmp_path, load):
    """Issue 34: a SHA256SUMS without model.safetensors let tampered weights load with exit 0."""
    copy = tmp_path / "demo-base"
    shutil.copytree(BASE, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    sums = (copy / SUMS_FILE).read_text().splitlines()
    (copy / SUMS_FILE).write_text("".join(f"{line}\n" for line in sums if "model.safetensors" not in line))
    with pytest.raises(StepError) as err:
        load(copy)
    message = str(err.value)
    assert "\n" not in message and f"{copy / SUMS_FILE}: does not list model.safetensors" in message
    assert "git checkout" in message and "sha256sum config.json model.safetensors" in message


def test_a_planted_unlisted_weights_file_is_refused(tmp_path):
    """pytorch_model.bin is read only without model.safetensors, but one the sums leave out is refused too."""
    copy = tmp_path / "demo-base"
    shutil.copytree(BASE, copy)
    (copy / "pytorch_model.bin").write_bytes(b"planted")
    with pytest.raises(StepError, match="does not list pytorch_model.bin"):
        from_pretrained(copy)


def test_loaded_files_name_every_file_the_loader_reads():
    from voxpipe.model.audiovae import AUDIOVAE_FILES
    from voxpipe.model.checksums import LOADED_FILES
    from voxpipe.model.encoder import TOKENIZER_FILES
    from voxpipe.model.io import MODEL_FILES

    assert set(LOADED_FILES) == {"config.json", *MODEL_FILES, *AUDIOVAE_FILES, *TOKENIZER_FILES}


def test_record_matches_the_make_script_inputs():
    script = _make_script()
    record = json.loads((BASE / script.RECORD).read_text())
    assert {k: record[k] for k in script.inputs()} == json.loads(json.dumps(script.inputs()))
    assert record["espeak_ng"].startswith("eSpeak NG")
    voices = {v[0] for v in script.VOICES.values()}
    assert not voices & set(record["sample_voices_excluded"])  # none of data/sample's voices
    assert record["clips"] == len(script.VOICES) * script.SENTENCES_PER_VOICE
    assert record["minutes_of_speech"] > 0
