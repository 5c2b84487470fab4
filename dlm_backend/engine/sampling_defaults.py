"""Where a request's decoding knobs come from when it does not name them: the checkpoint's own
defaults (``generation_config.json``'s ``dlm_sampling``), over its family's reference set-up, under
what the caller gives. ``LLM.sampling_params`` is the one place they are layered."""

from __future__ import annotations

from dlm_backend.engine.params import KNOBS, SamplingParams
from dlm_backend.errors import SamplingParamsError

#: The key of ``generation_config.json`` under which a checkpoint names its own decoding defaults.
CHECKPOINT_DEFAULTS_KEY = "dlm_sampling"


def checkpoint_defaults(generation_config: dict, source: str = "generation_config.json") -> dict:
    """The decoding defaults a checkpoint names under ``"dlm_sampling"`` in its generation config.

    A model knows the block length and cache mode it decodes best with, so every front end starts
    from these and the caller's own values win. Raises a :class:`SamplingParamsError` naming
    ``source`` when a key is not a decoding knob or a value is out of range.
    """
    given = generation_config.get(CHECKPOINT_DEFAULTS_KEY) or {}
    if not isinstance(given, dict):
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} must be an object of decoding knobs.")
    allowed = [n for n, k in KNOBS.items() if k.checkpoint]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} has {', '.join(unknown)}, which a "
                                  f"checkpoint cannot set. Allowed: {', '.join(allowed)}.")
    try:
        SamplingParams(**given)
    except SamplingParamsError as exc:
        raise SamplingParamsError(f"{source}: {CHECKPOINT_DEFAULTS_KEY!r} is invalid. {exc}") from None
    return dict(given)


def layered(checkpoint: dict, given: dict) -> dict:
    """SamplingParams fields: the checkpoint's defaults, then what the caller gave (the table's
    defaults fill the rest).

    The checkpoint's defaults describe one decoding set-up (its sampler's block, cache and
    threshold), so they are dropped when the caller picks another sampler. Defaults that name no
    sampler (a block length and cache only, say) hold for every sampler. A caller's
    ``cfg_scale > 0`` with no cache of its own gets ``cache="none"``, which CFG needs.
    """
    sampler = given.get("sampler")
    own = checkpoint if sampler is None or sampler == checkpoint.get("sampler", sampler) else {}
    values = {**own, **given}
    if (values.get("cfg_scale") or 0) > 0 and "cache" not in given:
        values["cache"] = "none"
    return values


def checkpoint_values(values: dict, source: str) -> dict:
    """Knob values a checkpoint file gives (a family's :meth:`~DiffusionLM.family_defaults` reading its
    reference's own fields), checked against the knob table; a SamplingParamsError naming ``source``
    when one is out of range."""
    try:
        SamplingParams(**values)
    except SamplingParamsError as exc:
        raise SamplingParamsError(f"{source}: {exc}") from None
    return dict(values)
