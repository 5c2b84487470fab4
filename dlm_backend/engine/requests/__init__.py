"""One request decoded pass by pass: what every request has (sequence.py), how each kind of family
decodes it (canvas_sequence.py, block_sequence.py, uniform_sequence.py,
causal_block_sequence.py, wedlm_sequence.py), its committed text and stop
strings (detokenizer.py), and the checks it passes before it is queued (admission.py).

The ways of decoding are request schedules, registered by name through the ``register_schedules``
hook as a plugin's are; a model family names its own (``DiffusionLM.schedule``)."""

from dlm_backend.engine.requests.block_sequence import BlockSequence
from dlm_backend.engine.requests.canvas_sequence import CanvasSequence
from dlm_backend.engine.requests.causal_block_sequence import CausalBlockSequence
from dlm_backend.engine.requests.sequence import Sequence
from dlm_backend.engine.requests.uniform_sequence import UniformSequence
from dlm_backend.engine.requests.wedlm_sequence import WeDLMSequence
from dlm_backend.errors import PluginError
from dlm_backend.hookspecs import hookimpl

#: The built-in schedules: full-sequence (LLaDA, Dream), block-diffusion (LLaDA2, SDAR, Fast-dLLM v2),
#: uniform noise (DiffusionGemma), block diffusion with causal context (Nemotron-Labs-Diffusion), WeDLM's
#: reordered causal passes.
BUILTIN_SCHEDULES = {"full": CanvasSequence, "block": BlockSequence, "uniform": UniformSequence,
                     "causal_block": CausalBlockSequence, "wedlm": WeDLMSequence}


@hookimpl
def register_schedules(register):
    for name, cls in BUILTIN_SCHEDULES.items():
        register(name, cls)


def schedule_class(name: str) -> type[Sequence]:
    """The registered schedule ``name`` (a model's ``schedule``); a PluginError listing the registered
    ones when nobody registered it."""
    from dlm_backend.plugins import registered_schedules

    table = registered_schedules()
    cls = table.get(name)
    if cls is None:
        raise PluginError(f"The model's request schedule {name!r} is not registered. Registered schedules: "
                          f"{', '.join(sorted(table))}. Install the plugin that registers it through the "
                          "'register_schedules' hook.")
    if not (isinstance(cls, type) and issubclass(cls, Sequence)):
        raise PluginError(f"The schedule {name!r} is registered as {cls!r}, which is not a subclass of "
                          "dlm_backend.engine.requests.sequence.Sequence.")
    return cls
