"""How an engine is built (engine/engine_config.py): device and dtype names checked before anything loads,
limits that are whole numbers, and the execution switches read from the environment once."""

import pytest
import torch

from dlm_backend import LLM, DLMError
from dlm_backend.engine.engine_config import EngineConfig, EngineLimits


@pytest.mark.parametrize("kwargs,match", [
    ({"dtype": "float8"}, "dtype 'float8' is not supported; use 'auto' or one of float32, float16, bfloat16"),
    ({"kv_cache_memory": 1000}, "at least 1 MiB"),
    ({"config_overrides": [("mask_token_id", 5)]}, "config_overrides must be a dict"),
    ({"kernels": "fast"}, "not a kernel mode"),
])
def test_bad_settings_are_named_before_anything_loads(kwargs, match):
    with pytest.raises(DLMError, match=match):
        EngineConfig(model="/nonexistent", **kwargs)


def test_the_environment_is_read_when_the_config_is_made(monkeypatch):
    monkeypatch.setenv("DLM_KERNELS", " Torch ")
    monkeypatch.setenv("DLM_CUDA_GRAPHS", "0")
    config = EngineConfig(model="m")
    monkeypatch.setenv("DLM_KERNELS", "triton")
    assert (config.kernels, config.cuda_graphs) == ("torch", False)       # later changes do not reach it
    assert EngineConfig(model="m").kernels == "triton"
    assert EngineConfig(model="m", device="cpu").torch_dtype == torch.float32   # bf16 is slow on CPU cores


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens", "max_waiting", "max_model_len"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_limits_are_whole_numbers_of_at_least_one(field, value):
    with pytest.raises(DLMError, match=f"{field} must be an integer >= 1"):
        EngineLimits(**{field: value})
    assert EngineLimits(max_model_len=None).max_model_len is None


def test_devices_the_machine_lacks_are_named():
    with pytest.raises(DLMError, match="not a device name"):
        LLM(device="foo")
    if not torch.cuda.is_available():
        with pytest.raises(DLMError, match="no CUDA GPU"):
            LLM(device="cuda")
