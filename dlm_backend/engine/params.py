"""Per-request sampling parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dlm_backend.errors import SamplingParamsError

CACHE_MODES = ("none", "prefix", "dual")
REMASKING = ("low_confidence", "random")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
#: The key of ``generation_config.json`` under which a checkpoint names its own decoding defaults.
CHECKPOINT_DEFAULTS_KEY = "dlm_sampling"
#: What a checkpoint may set there: how it is decoded, not what the caller asks for (length, stops,
#: temperature and seed stay the caller's; so does ``steps``, which only means something per length).
CHECKPOINT_KNOBS = ("sampler", "block_length", "cache", "threshold", "factor", "gamma", "remasking",
                    "alg", "alg_temp", "eps")


@dataclass
class SamplingParams:
    """How one request is decoded.

    The canvas holds ``max_tokens`` masked slots, filled block by block (``block_length`` slots each,
    the last block may be shorter). ``sampler`` picks the rule that decides which masked slots are
    committed at each denoising pass; ``cache`` picks how much of the canvas is recomputed per pass.

    Fields not used by the chosen sampler are ignored (``steps`` by the adaptive samplers,
    ``alg`` by everything but ``dream``). ``None`` means "the sampler's default".
    """

    max_tokens: int = 128
    sampler: str = "threshold"
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool = False
    cache: str = "none"
    # threshold / factor / entropy-bounded rules
    threshold: float = 0.9
    factor: float = 1.0
    gamma: float = 0.1
    # LLaDA reference options
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    # Dream reference options
    alg: str = "maskgit_plus"
    alg_temp: float | None = None
    eps: float = 1e-3
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise SamplingParamsError("Invalid SamplingParams: stop must be a string or a list of strings.")
        self.stop = list(self.stop or [])
        for name in ("temperature", "threshold", "factor", "gamma", "cfg_scale", "eps", "top_p", "alg_temp"):
            value = getattr(self, name)      # a JSON body may send "0.9": a 400 naming it, not a TypeError
            if not (_is_number(value) or (value is None and name in ("top_p", "alg_temp"))):
                raise SamplingParamsError(f"Invalid SamplingParams: {name} must be a number, got {value!r}.")
        for name in ("ignore_eos", "logits_eos_inf", "confidence_eos_eot_inf"):
            if not isinstance(getattr(self, name), bool):     # "false" is truthy
                raise SamplingParamsError(f"Invalid SamplingParams: {name} must be true or false, "
                                          f"got {getattr(self, name)!r}.")
        checks = [
            (_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens must be an integer >= 1"),
            (self.block_length is None or (_is_int(self.block_length) and self.block_length >= 1),
             "block_length must be an integer >= 1 (or None for the sampler's default)"),
            (self.steps is None or (_is_int(self.steps) and self.steps >= 1),
             "steps must be an integer >= 1 (or None for one token per step)"),
            (self.temperature >= 0, "temperature must be >= 0 (0 is greedy)"),
            (self.top_p is None or 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k is None or (_is_int(self.top_k) and self.top_k >= 1), "top_k must be an integer >= 1"),
            # torch.Generator.manual_seed takes [-2**63, 2**64); past that it fails inside the engine.
            (self.seed is None or (_is_int(self.seed) and -2**63 <= self.seed < 2**64),
             "seed must be an integer in [-2**63, 2**64)"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings"),
            (self.cache in CACHE_MODES, f"cache must be one of {', '.join(CACHE_MODES)}"),
            (0 < self.threshold <= 1, "threshold must be in (0, 1]"),
            (self.factor > 0, "factor must be > 0"),
            (self.gamma >= 0, "gamma must be >= 0"),
            (self.remasking in REMASKING, f"remasking must be one of {', '.join(REMASKING)}"),
            (self.cfg_scale >= 0, "cfg_scale must be >= 0"),
            (self.alg in DREAM_ALGS, f"alg must be one of {', '.join(DREAM_ALGS)}"),
            (self.alg_temp is None or self.alg_temp >= 0, "alg_temp must be >= 0"),
            (0 < self.eps < 1, "eps must be in (0, 1)"),
            (isinstance(self.sampler, str) and self.sampler, "sampler must be a registered sampler name"),
        ]
        for ok, message in checks:
            if not ok:
                raise SamplingParamsError(f"Invalid SamplingParams: {message}.")
        if self.cfg_scale > 0 and self.cache != "none":
            raise SamplingParamsError(
                "Invalid SamplingParams: cfg_scale > 0 needs cache='none' (the unconditional pass "
                "recomputes the whole canvas). Set cache='none' or cfg_scale=0.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checkpoint_defaults(generation_config: dict, source: str = "generation_config.json") -> dict:
    """The decoding defaults a checkpoint names under ``"dlm_sampling"`` in its generation config.

    A model knows the block length and cache mode it decodes best with (the threshold rule scores
    dlm-tiny's held-out set 69.6% exact at block 4 and 60-65% at 32), so every front end starts
    from these and the caller's own values win. Raises a :class:`SamplingParamsError` naming
    ``source`` when a key is not a decoding knob or a value is out of range.
    """
    given = generation_config.get(CHECKPOINT_DEFAULTS_KEY) or {}
    if not isinstance(given, dict):
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} must be an object of decoding knobs.")
    unknown = sorted(set(given) - set(CHECKPOINT_KNOBS))
    if unknown:
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} has {', '.join(unknown)}, which a "
                                  f"checkpoint cannot set. Allowed: {', '.join(CHECKPOINT_KNOBS)}.")
    try:
        SamplingParams(**given)
    except SamplingParamsError as exc:
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} is invalid. {exc}") from None
    return dict(given)


def layered(checkpoint: dict, given: dict, base: dict | None = None) -> dict:
    """SamplingParams fields from ``base``, then the checkpoint's defaults, then what the caller gave.

    The checkpoint's defaults describe one decoding set-up (its sampler's block, cache and
    threshold), so they are dropped when the caller picks another sampler. Defaults that name no
    sampler (a block length and cache only, say) hold for every sampler. A caller's
    ``cfg_scale > 0`` with no cache of its own gets ``cache="none"``, which CFG needs.
    """
    sampler = given.get("sampler")
    own = checkpoint if sampler is None or sampler == checkpoint.get("sampler", sampler) else {}
    values = {**(base or {}), **own, **given}
    if (values.get("cfg_scale") or 0) > 0 and "cache" not in given:
        values["cache"] = "none"
    return values

