"""One engine per (model, device, dtype, execution switches), limits set on it, freed by close()."""

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine import shared_engines as shared
from dlm_backend.errors import DLMError

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def test_handles_share_one_engine_and_the_last_close_frees_it(tmp_path):
    import shutil

    folder = shutil.copytree(PARITY / "llada-tiny", tmp_path / "m")     # a key no other test holds
    a = LLM(str(folder))
    with LLM(str(folder) + "/", device="cpu") as b:                     # the same weights, another spelling
        assert b.engine is a.engine
        assert b.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=PARAMS)[0].num_generated_tokens == 4
    assert a.engine.runner.model is not None                            # a still holds it
    key = a.config.key
    a.close()
    a.close()                                                           # idempotent
    assert key not in shared.loaded() and a.engine.runner.model is None
    with pytest.raises(DLMError, match="closed"):
        a.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=PARAMS)
    c = LLM(str(folder))                                                # loads again
    assert c.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=PARAMS)[0].num_generated_tokens == 4
    c.close()


def test_closing_ends_the_requests_in_flight(tmp_path):
    import shutil

    folder = shutil.copytree(PARITY / "llada-tiny", tmp_path / "m")
    llm = LLM(str(folder))
    stream = llm.stream(prompt_token_ids=[1, 2, 3], sampling_params=SamplingParams(max_tokens=32, block_length=4,
                                                                                   sampler="llada"))
    first = next(stream)
    llm.close()
    rest = list(stream)
    assert not first.finished and rest[-1].finished and rest[-1].finish_reason == "abort"


def test_limits_are_set_on_the_shared_engine():
    a = LLM(str(PARITY / "dream-tiny"))
    before = a.engine.limits
    b = LLM(str(PARITY / "dream-tiny"), max_num_seqs=3)
    assert a.engine is b.engine and a.engine.limits.max_num_seqs == 3
    assert a.engine.limits.max_waiting == before.max_waiting             # limits not given are kept
    b.engine.set_limits(max_num_seqs=before.max_num_seqs)
    with pytest.raises(DLMError, match="max_waiting must be an integer >= 1"):
        LLM(str(PARITY / "dream-tiny"), max_waiting=0)


def test_execution_switches_make_separate_engines():
    a = LLM(str(PARITY / "llada-tiny"), kernels="torch")
    b = LLM(str(PARITY / "llada-tiny"), kernels="auto")
    assert a.engine is not b.engine and a.config.key != b.config.key


def test_only_limits_set_explicitly_change_the_shared_engine(tmp_path):
    """A server on a model an LLM already runs with its own limits reset them to 64/256: it always
    passed every default. Now only the limits a front door names change the engine."""
    import shutil

    from dlm_backend.cli import build_parser
    from dlm_backend.engine.engine_config import EngineLimits
    from dlm_backend.server.settings import ServerConfig
    from dlm_backend.server.model import ServedModel

    folder = str(shutil.copytree(PARITY / "dream-tiny", tmp_path / "m"))
    llm = LLM(folder, max_num_seqs=4, max_waiting=2)
    served = ServedModel(ServerConfig(model=folder))
    assert served.llm().engine is llm.engine
    assert (llm.engine.limits.max_num_seqs, llm.engine.limits.max_waiting) == (4, 2)
    assert served.capacity == 6                                           # the server's slots are the engine's
    other = ServedModel(ServerConfig(model=folder, limits={"max_num_seqs": 3}))
    other.llm()
    assert (llm.engine.limits.max_num_seqs, llm.engine.limits.max_waiting) == (3, 2)
    serve = build_parser().parse_args(["serve"])
    assert all(getattr(serve, f) is None for f in vars(EngineLimits()))  # flags left out keep the engine's
    with pytest.raises(DLMError, match="Did you mean 'max_num_seqs'"):
        ServerConfig(limits={"max_num_seq": 3})
    with pytest.raises(DLMError, match="max_waiting must be an integer >= 1"):
        ServerConfig(limits={"max_waiting": 0})
    for handle in (served, other):
        handle.close()
    llm.close()
