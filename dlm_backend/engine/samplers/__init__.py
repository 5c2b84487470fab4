"""Built-in samplers, registered through the same hook a third-party plugin uses."""

from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput, TokenInfo
from dlm_backend.engine.samplers.diffusiongemma import DiffusionGemmaSampler
from dlm_backend.engine.samplers.dream import DreamSampler
from dlm_backend.engine.samplers.entropy_bounded import EntropyBoundedSampler
from dlm_backend.engine.samplers.factor import FactorSampler
from dlm_backend.engine.samplers.fastdllm2 import FastDLLM2Sampler
from dlm_backend.engine.samplers.llada import LLaDASampler
from dlm_backend.engine.samplers.llada2 import LLaDA2EditSampler, LLaDA2Sampler
from dlm_backend.engine.samplers.nemotron import NemotronARSampler, NemotronSampler, NemotronSpecSampler
from dlm_backend.engine.samplers.sdar import SDARSampler
from dlm_backend.engine.samplers.threshold import ThresholdSampler
from dlm_backend.engine.samplers.wedlm import WeDLMSampler
from dlm_backend.hookspecs import hookimpl

BUILTIN_SAMPLERS = (LLaDASampler, DreamSampler, ThresholdSampler, FactorSampler, EntropyBoundedSampler,
                    LLaDA2Sampler, LLaDA2EditSampler, SDARSampler, FastDLLM2Sampler, DiffusionGemmaSampler,
                    NemotronSampler, NemotronARSampler, NemotronSpecSampler, WeDLMSampler)


@hookimpl
def register_samplers(register):
    for cls in BUILTIN_SAMPLERS:
        register(cls.name, cls)


__all__ = ["Commit", "Sampler", "StepInput", "TokenInfo", *[c.__name__ for c in BUILTIN_SAMPLERS]]
