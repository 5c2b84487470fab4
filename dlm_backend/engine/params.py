"""Per-request sampling parameters: the one knob table every front door derives from.

Each field of :class:`SamplingParams` is declared once, with its default, type, range, whether a
checkpoint may set it and its other names (:func:`knob`). The adapters' fields, the server's body,
the CLI flags and the checkpoint defaults are all read from that table (:data:`KNOBS`), so a knob
added here appears everywhere and a misspelled one is refused everywhere with the nearest name.
A plugin sampler declares its own knobs on its class (``Sampler.knobs``); they join the table when
it is registered (``plugins.registered_knobs``) and a SamplingParams keeps their values in ``options``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field

from dlm_backend.errors import SamplingParamsError

CACHE_MODES = ("none", "prefix", "dual")
REMASKING = ("low_confidence", "random", "low_confidence_dynamic", "sequential")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
#: Temperatures (and ``alg_temp``) below this are greedy: dividing logits by 5e-324 overflows to NaN.
GREEDY_BELOW = 1e-5
MAX_STOP = 16                   # stop strings per request, each at most MAX_STOP_CHARS characters
MAX_STOP_CHARS = 256            # ... and any string knob (a cache_salt, say)
MAX_TOP_LOGPROBS = 20           # OpenAI's top_logprobs bound
MAX_LENGTH = 1 << 20            # max_tokens / block_length cap before the context check (allocation bound)
MAX_DENOISING_STEPS = 4096      # a canvas's passes: the reference's default is 48


@dataclass(frozen=True)
class Knob:
    """What the table says about one field: its type, allowed values, and who may set it."""

    doc: str
    kind: type
    low: float | None = None          # inclusive, unless low_open
    high: float | None = None         # inclusive, unless high_open
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nullable: bool = False            # None allowed (it means what ``doc`` says)
    checkpoint: bool = False          # a checkpoint's ``dlm_sampling`` may set it
    aliases: tuple[str, ...] = ()     # other names the front doors accept (where the framework has not taken them)
    item: type = str                  # a list knob's element type
    #: Its name at the framework front doors (LangChain, LlamaIndex, LiteLLM) when a framework owns
    #: the field's own name (LangChain's and LiteLLM's ``cache`` is their response cache); there
    #: only this name works, and it is accepted everywhere else too.
    framework: str | None = None
    default: object = None            # the value when unset (a built-in's is its field's: knob() copies it)

    def check(self, name: str, value):
        """``value`` if it is allowed for field ``name``, else a SamplingParamsError naming the rule."""
        if value is None and self.nullable:
            return value
        kinds = {int: "an integer", float: "a number", bool: "true or false",
                 str: f"a string of at most {MAX_STOP_CHARS} characters"}
        ok = isinstance(value, bool) if self.kind is bool else (
            isinstance(value, (int, float) if self.kind is float else self.kind) and not isinstance(value, bool))
        ok = ok and (self.kind is not str or len(value) <= MAX_STOP_CHARS)    # every string a client sends is bounded
        if self.kind is list:
            ok = isinstance(value, list) and len(value) <= MAX_STOP and all(
                isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS if self.item is str else
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < MAX_LENGTH for s in value)
        if not ok:
            want = kinds.get(self.kind, f"a string or a list of at most {MAX_STOP} non-empty strings of up to "
                                        f"{MAX_STOP_CHARS} characters" if self.item is str else
                             f"a list of at most {MAX_STOP} token ids")
            raise SamplingParamsError(f"Invalid SamplingParams: {name} must be {want}"
                                      f"{' (or null)' if self.nullable else ''}, got {value!r:.80}.", param=name)
        if self.kind is float and not math.isfinite(value):
            raise SamplingParamsError(f"Invalid SamplingParams: {name} must be a finite number, got {value!r}.",
                                      param=name)
        if self.choices is not None and value not in self.choices:
            raise SamplingParamsError(f"Invalid SamplingParams: {name} must be one of {', '.join(self.choices)}, "
                                      f"got {value!r:.80}.", param=name)
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            raise SamplingParamsError(f"Invalid SamplingParams: {name} must be in {self.range}, got {value!r}.",
                                      param=name)
        return value

    @property
    def range(self) -> str:
        return f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"


def _num(x) -> str:
    if x is None:
        return "inf"
    if isinstance(x, int) and abs(x) >= 2**32 and (abs(x) & (abs(x) - 1)) == 0:
        return f"{'-' if x < 0 else ''}2**{abs(x).bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def knob(default, doc: str, kind: type, **rules) -> dataclasses.Field:
    """A SamplingParams field with its entry in the knob table."""
    meta = {"knob": Knob(doc, kind, default=default, **rules)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class SamplingParams:
    """How one request is decoded.

    The canvas holds ``max_tokens`` slots, filled block by block (``block_length`` slots each, the
    last block may be shorter). ``sampler`` picks the rule that decides which slots are committed at
    each denoising pass; ``cache`` picks how much of the canvas is recomputed per pass. Fields the
    chosen sampler does not use are ignored. ``None`` means "the sampler's default".
    """

    max_tokens: int = knob(256, "tokens to generate (the canvas size)", int, low=1, high=MAX_LENGTH,
                           aliases=("max_completion_tokens", "max_new_tokens", "gen_length"))
    sampler: str = knob("threshold", "denoising rule (`dlm plugins` lists them)", str, checkpoint=True)
    block_length: int | None = knob(None, "slots denoised per block (None: the sampler's default; "
                                    "diffusiongemma: the canvas, config.json's canvas_length)", int,
                                    low=1, high=MAX_LENGTH, nullable=True, checkpoint=True, aliases=("canvas_length",))
    steps: int | None = knob(None, "passes for llada/dream, at most max_tokens (None: one token per pass)", int,
                             low=1, high=MAX_LENGTH, nullable=True)
    temperature: float = knob(0.0, f"0 is greedy (as is anything below {GREEDY_BELOW:g})", float, low=0, high=2)
    top_p: float | None = knob(None, "nucleus sampling mass", float, low=0, high=1, low_open=True, nullable=True)
    top_k: int | None = knob(None, "sample among the k most likely tokens", int, low=1, high=MAX_LENGTH,
                             nullable=True)
    seed: int | None = knob(None, "fixes sampled output", int, low=-2**63, high=2**64, high_open=True,
                            nullable=True)
    stop: list[str] = knob([], "strings that end the output (not included)", list)
    stop_token_ids: list[int] = knob([], "token ids that end the output besides the model's end tokens (the "
                                     "token is the output's stop_reason)", list, item=int)
    ignore_eos: bool = knob(False, "keep going past the model's end tokens (stop_token_ids still stop)", bool)
    logprobs: int | None = knob(None, "return each generated token's log-probability at the pass that committed "
                                "it, with this many likeliest alternatives (0: none; None: no logprobs)", int, low=0,
                                high=MAX_TOP_LOGPROBS, nullable=True, framework="top_logprobs")
    stream_canvas: bool = knob(False, "stream each pass's window of the canvas (committed, drafted and masked "
                               "slots), not only committed text", bool)
    cache: str = knob("dual", "KV cache: none (reference-exact), prefix or dual", str, choices=CACHE_MODES,
                      checkpoint=True, framework="kv_cache")
    cache_salt: str | None = knob(None, "prefix cache: prompt pages are shared only among requests with the same "
                                  "salt (one per tenant keeps tenants apart; None: the shared cache)", str,
                                  nullable=True)
    threshold: float = knob(0.9, "threshold rule: commit slots at least this confident", float, low=0, high=1,
                            low_open=True, checkpoint=True)
    factor: float = knob(1.0, "factor rule: larger commits more per pass", float, low=0, high=1000, low_open=True,
                         checkpoint=True)
    gamma: float = knob(0.1, "entropy_bounded, diffusiongemma: entropy budget per pass (the lowest-entropy "
                        "slots are taken while the ones before sum to at most this)", float, low=0, high=1000,
                        checkpoint=True, aliases=("entropy_bound",))
    remasking: str = knob("low_confidence", "llada, sdar: which slots a pass commits (sdar also "
                          "low_confidence_dynamic: above threshold, else the top ones; sequential)", str,
                          choices=REMASKING, checkpoint=True)
    cfg_scale: float = knob(0.0, "llada classifier-free guidance (needs cache='none')", float, low=0, high=100)
    logits_eos_inf: bool = knob(False, "llada: never predict EOS", bool)
    confidence_eos_eot_inf: bool = knob(False, "llada: EOS/end-of-turn never win on confidence", bool)
    alg: str = knob("maskgit_plus", "dream: confidence measure", str, choices=DREAM_ALGS, checkpoint=True)
    alg_temp: float | None = knob(None, f"dream: sample slots by confidence (below {GREEDY_BELOW:g}: off)", float,
                                  low=0, high=100, nullable=True, checkpoint=True)
    eps: float = knob(1e-3, "dream: last timestep of the schedule", float, low=0, high=1, low_open=True,
                      high_open=True, checkpoint=True)
    # block-diffusion families
    eos_early_stop: bool = knob(True, "block families: end at a final stop token, not at its block's end", bool,
                                checkpoint=True)
    sub_block_length: int | None = knob(None, "fastdllm2: slots decided together inside a block (None: 8)", int,
                                        low=1, high=MAX_LENGTH, nullable=True, checkpoint=True)
    editing_threshold: float = knob(0.9, "llada2_edit: rewrite a committed slot whose new token is this "
                                    "confident", float, low=0, high=1, checkpoint=True)
    max_post_steps: int = knob(16, "llada2_edit: editing passes after a block's last mask", int, low=0, high=1024,
                               checkpoint=True)
    num_to_transfer: int = knob(1, "llada2_edit: slots committed per pass at least", int, low=1, high=MAX_LENGTH,
                                checkpoint=True)
    # uniform-noise families (DiffusionGemma)
    t_max: float = knob(0.8, "diffusiongemma: temperature at a canvas's first step (falls linearly to t_min)",
                        float, low=0, high=100, low_open=True, checkpoint=True)
    t_min: float = knob(0.4, "diffusiongemma: temperature at the last step (below t_max)", float, low=0, high=100,
                        checkpoint=True)
    max_denoising_steps: int = knob(48, "diffusiongemma: decoder passes per canvas at most", int, low=1,
                                    high=MAX_DENOISING_STEPS, checkpoint=True)
    stability_threshold: int = knob(1, "diffusiongemma: a canvas is done when its argmax equals that of this many "
                                    "passes before (0: always stable) ...", int, low=0, high=MAX_DENOISING_STEPS,
                                    checkpoint=True)
    confidence_threshold: float = knob(0.005, "diffusiongemma: ... and its mean entropy is below this (0: runs "
                                       "max_denoising_steps)", float, low=0, high=1e6, checkpoint=True)
    #: registered samplers' own knobs (``Sampler.knobs``) by name: pass them by name like any knob, read
    #: any knob with get()
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.stop, (str, tuple)) or self.stop is None:
            self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        self.stop_token_ids = [] if self.stop_token_ids is None else self.stop_token_ids
        for name, spec in KNOBS.items():
            spec.check(name, getattr(self, name))
        self.options = dict(self.options)
        for name, value in self.options.items():
            plugin_knob(name).check(name, value)
        if self.temperature < GREEDY_BELOW:
            self.temperature = 0.0
        if self.alg_temp is not None and self.alg_temp < GREEDY_BELOW:
            self.alg_temp = None
        if self.steps is not None and self.steps > self.max_tokens:
            raise SamplingParamsError(f"Invalid SamplingParams: steps ({self.steps}) must be at most max_tokens "
                                      f"({self.max_tokens}): every pass commits at least one token.",
                                      param="steps")
        if self.cfg_scale > 0 and self.cache != "none":
            raise SamplingParamsError(
                "Invalid SamplingParams: cfg_scale > 0 needs cache='none' (the unconditional pass "
                "recomputes the whole canvas). Set cache='none' or cfg_scale=0.", param="cfg_scale")

    def replace(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def get(self, name: str):
        """A knob's value by name: a field, or a registered sampler's own knob (its default when unset)."""
        return getattr(self, name) if name in KNOBS else self.options.get(name, plugin_knob(name).default)


# The generated __init__ takes the fields alone; wrapped, any other keyword goes into ``options``, where
# __post_init__ checks it against the registered samplers' own knobs: SamplingParams(per_pass=4) then
# works once a sampler declares per_pass, and a misspelling is a SamplingParamsError naming the
# nearest knob instead of a TypeError.
_FIELDS, _fields_init = frozenset(f.name for f in dataclasses.fields(SamplingParams)), SamplingParams.__init__


@functools.wraps(_fields_init)
def _init(self, *args, options: dict | None = None, **given):
    own = {name: given.pop(name) for name in [n for n in given if n not in _FIELDS]}
    _fields_init(self, *args, options={**(options or {}), **own}, **given)


SamplingParams.__init__ = _init

#: The knob table: field name -> :class:`Knob`, in declaration order.
KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in dataclasses.fields(SamplingParams)
                          if "knob" in f.metadata}
#: Every name a front door may use for a knob -> the field it sets.
KNOB_NAMES: dict[str, str] = {**{a: n for n, k in KNOBS.items() for a in (*k.aliases, k.framework) if a},
                              **{n: n for n in KNOBS}}
#: Each knob's name at the framework front doors (``cache`` -> ``kv_cache``): field -> name.
FRAMEWORK_NAMES: dict[str, str] = {n: k.framework or n for n, k in KNOBS.items()}
#: Field names a framework owns, so its front door refuses them as knobs (pass to :func:`knob_values`).
FRAMEWORK_TAKEN: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.framework)
DEFAULTS = SamplingParams()


def knob_values(given: dict, taken: tuple[str, ...] = (), where: str = "request") -> dict:
    """SamplingParams fields from a front door's knob arguments (aliases resolved, ``None`` = unset).

    ``taken`` are names the framework itself owns (:data:`FRAMEWORK_TAKEN` at the framework front
    doors); there only the knob's framework name works. An unknown name is a SamplingParamsError
    naming the nearest knob.
    """
    values: dict = {}
    for name, value in given.items():
        target = KNOB_NAMES.get(name) if name not in taken else None
        if target is None:                      # a registered sampler's own knob, else a misspelling
            plugin_knob(name, [n for n in KNOB_NAMES if n not in taken], where)
            target = name
        if value is not None:
            values[target] = value
    return values


def plugin_knob(name: str, valid=KNOBS, where: str = "SamplingParams") -> Knob:
    """A registered sampler's own knob (``Sampler.knobs``), else the error naming the nearest known name."""
    from dlm_backend.plugins import registered_knobs

    table = registered_knobs()
    if name not in table:
        raise unknown_field(name, [*valid, *table], where)
    return table[name]


def unknown_field(name: str, valid, where: str, kind: str = "knobs") -> SamplingParamsError:
    """The error for a field nobody declared, naming the closest valid one (else every valid ``kind``)."""
    near = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    hint = f" Did you mean {near[0]!r}?" if near else f" Valid {kind}: {', '.join(sorted(valid))}."
    return SamplingParamsError(f"Unknown {where} field {name!r}.{hint}", param=str(name))
