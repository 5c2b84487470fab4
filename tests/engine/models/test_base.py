"""The model family contract (engine/models/base.py): what a family must implement, the schedule each
built-in family names (the one the engine decoded it with before schedules were registered), and
the defaults a family without conditioning or a schedule of its own never writes."""

import pytest
import torch
from tests.helpers import FIXTURES

from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.requests import schedule_class
from dlm_backend.engine.requests.block_sequence import BlockSequence
from dlm_backend.engine.requests.canvas_sequence import CanvasSequence
from dlm_backend.engine.requests.uniform_sequence import UniformSequence
from dlm_backend.errors import CheckpointError, PluginError

ARGS = ModelArgs(vocab_size=16, hidden_size=8, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=8,
                 max_positions=64, rope_theta=10000.0, norm_eps=1e-6, mask_token_id=15)


@pytest.mark.parametrize("folder,schedule,sequence", [
    ("parity/llada-tiny", "full", CanvasSequence),
    ("parity/dream-tiny", "full", CanvasSequence),
    ("parity-block/llada2-tiny", "block", BlockSequence),
    ("parity-block/sdar-tiny", "block", BlockSequence),
    ("parity-block/fastdllm2-tiny", "block", BlockSequence),
    ("parity-block/diffusiongemma-tiny", "uniform", UniformSequence),
])
def test_each_built_in_family_names_the_schedule_it_always_decoded_with(folder, schedule, sequence):
    config = read_config(FIXTURES / folder)
    cls = resolve_model_class(config)
    with torch.device("meta"):
        model = from_config_json(cls.from_config, config)
    assert isinstance(model, DiffusionLM) and model.schedule == schedule
    assert schedule_class(model.schedule) is sequence


def test_a_family_missing_part_of_the_contract_cannot_be_built():
    class Half(DiffusionLM):
        def head(self):
            return None, None

    with pytest.raises(TypeError, match="args_from_config.*forward.*from_config"):
        Half(ARGS)


class Plain(DiffusionLM):
    """The whole contract, nothing else: the defaults a plain family inherits."""

    @classmethod
    def args_from_config(cls, config):
        return ARGS

    @classmethod
    def from_config(cls, config):
        return cls(cls.args_from_config(config))

    def forward(self, input_ids, positions):
        return torch.zeros(len(input_ids), ARGS.hidden_size)

    def head(self):
        return None, None


def test_a_plain_family_decodes_full_sequence_and_refuses_conditioning_by_name():
    model = Plain.from_config({})
    assert model.schedule == "full" and model.noise == "mask"
    with pytest.raises(TypeError, match="Plain takes no conditioning input"):
        model.conditioning_input(torch.zeros(2, 16))


def test_an_unregistered_schedule_is_an_error_listing_the_registered_ones():
    with pytest.raises(PluginError, match=r"'nope' is not registered. Registered schedules: block, (\w+, )*full, "
                                          r"uniform"):
        schedule_class("nope")


def test_a_config_field_the_family_reads_and_config_json_lacks_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="config.json lacks 'vocab_size'"):
        from_config_json(lambda config: config["vocab_size"], {})
