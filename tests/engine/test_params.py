"""Sampling parameters (engine/params.py): impossible values refused with a SamplingParamsError that
says what to change. The checkpoint's own defaults: checkpoint/test_load.py; the checks against
the model a request is for: requests/test_admission.py."""

import pytest

from dlm_backend import SamplingParams
from dlm_backend.errors import SamplingParamsError


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"block_length": 0}, "block_length"),
    ({"steps": -1}, "steps"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"threshold": 0}, "threshold"),
    ({"cache": "paged"}, "cache must be one of none, prefix, dual"),
    ({"remasking": "oops"}, "remasking"),
    ({"alg": "oops"}, "alg"),
    ({"cfg_scale": 1.0, "cache": "dual"}, "cfg_scale > 0 needs cache='none'"),
    ({"stop": [""]}, "stop"),
    # wrong types, as a JSON body sends them: a named 400, not a TypeError (a 500)
    ({"threshold": "0.9"}, "threshold must be a number, got '0.9'"),
    ({"cfg_scale": "1"}, "cfg_scale must be a number"),
    ({"temperature": None}, "temperature must be a number"),
    ({"top_p": "1"}, "top_p must be a number"),
    ({"ignore_eos": "false"}, "ignore_eos must be true or false"),
    ({"stop": 5}, "stop must be a string or a list"),
    # past torch.Generator's range: an overflow inside the engine, reported as an engine failure
    ({"seed": 2**64}, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
    ({"seed": -2**63 - 1}, "seed must be in"),
])
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**kwargs)


# -- found by driving the API and CLI with odd input; each was a traceback or a leak --


def test_a_misspelled_keyword_is_a_named_error_with_the_nearest_knob_not_a_type_error():
    with pytest.raises(SamplingParamsError, match="Unknown SamplingParams field 'temprature'. Did you mean "
                                                  "'temperature'?") as caught:
        SamplingParams(temprature=0.5)
    assert caught.value.param == "temprature"
    with pytest.raises(SamplingParamsError, match="Unknown SamplingParams field 'zzz'"):
        SamplingParams(options={"zzz": 1})


def test_get_reads_a_built_in_knob_by_name_and_the_table_keeps_its_declared_default():
    from dlm_backend.engine.params import DEFAULTS, KNOBS

    params = SamplingParams(threshold=0.5)
    assert params.get("threshold") == 0.5 and params.get("cache") == "dual"
    assert "options" not in KNOBS                                   # plugin values, not a knob of their own
    assert all(KNOBS[n].default == getattr(DEFAULTS, n) for n in KNOBS)
    assert params.replace(threshold=0.7).options == {}
    with pytest.raises(SamplingParamsError, match="Did you mean 'threshold'"):
        params.get("threshhold")
