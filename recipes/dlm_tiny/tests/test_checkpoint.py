"""dlm-tiny's decoding defaults are checked by the engine's own reader before they are written."""

import json

import pytest

from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL
from dlm_backend.engine.sampling_defaults import checkpoint_defaults
from dlm_backend.errors import SamplingParamsError
from dlm_tiny import checkpoint


def test_the_shipped_defaults_are_the_recipes_read_as_the_engine_reads_them():
    shipped = json.loads((EMBEDDED_MODEL / "generation_config.json").read_text())
    assert checkpoint_defaults(shipped) == checkpoint.SAMPLING_DEFAULTS


def test_defaults_the_engine_would_refuse_are_never_written(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "SAMPLING_DEFAULTS", {"sampler": "threshold", "threshold": 5.0})
    with pytest.raises(SamplingParamsError, match="threshold must be in"):
        checkpoint.write_checkpoint_files(tmp_path / "m", {"eos_token_id": 0, "pad_token_id": 0,
                                                           "mask_token_id": 3}, tok=None)
    assert not (tmp_path / "m" / "generation_config.json").exists()
