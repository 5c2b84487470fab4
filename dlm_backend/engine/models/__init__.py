"""Built-in model families, registered through the same hook a third-party plugin uses."""

from dlm_backend.hookspecs import hookimpl

# HF ``architectures`` string -> "module:Class". Imported only when a checkpoint asks for it.
BUILTIN_MODELS = {
    "LLaDAModelLM": "dlm_backend.engine.models.llada:LLaDAModelLM",
    "DreamModel": "dlm_backend.engine.models.dream:DreamModel",
    "LLaDAMoEModelLM": "dlm_backend.engine.models.llada_moe:LLaDAMoEModelLM",
    "LLaDA2MoeModelLM": "dlm_backend.engine.models.llada2:LLaDA2MoeModelLM",
    "SDARForCausalLM": "dlm_backend.engine.models.sdar:SDARForCausalLM",
    "SDARMoeForCausalLM": "dlm_backend.engine.models.sdar:SDARMoeForCausalLM",
    "Fast_dLLM_QwenForCausalLM": "dlm_backend.engine.models.fastdllm2:Fast_dLLM_QwenForCausalLM",
    "DiffusionGemmaForBlockDiffusion": "dlm_backend.engine.models.diffusion_gemma:DiffusionGemmaForBlockDiffusion",
    "NemotronLabsDiffusionModel": "dlm_backend.engine.models.nemotron_labs:NemotronLabsDiffusionModel",
    "WeDLMForCausalLM": "dlm_backend.engine.models.wedlm:WeDLMForCausalLM",
}


@hookimpl
def register_models(register):
    for arch, target in BUILTIN_MODELS.items():
        register(arch, target)
