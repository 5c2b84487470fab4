"""``dlm parity``: run a fixture folder's recorded reference calls through the engine and compare.

A fixture folder is a checkpoint (config.json, model.safetensors, generation_config.json) with
``cases.json`` (reference sampler calls: arguments, outputs, forward counts) and
``expected_logits.safetensors`` (forward tensors). Both the full-sequence layout
(``fixtures/parity``) and the block layout (``fixtures/parity-block``) are read; a new family's
fixtures made the same way can be checked the same way. Every case is greedy or seeded; those the
reference drew at random pass with the same seed, or with ``replay`` the draws the reference
recorded are handed to the engine instead (samplers/random.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from dlm_backend.engine.checkpoint.folder import checkpoint_config, resolve_checkpoint
from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.errors import CheckpointError, DLMError
from dlm_backend.parity import nemotron_cases
from dlm_backend.parity.cases import SAMPLERS as CASES, Run
from dlm_backend.parity.forward import fixture_checks

#: reference sampler name -> its engine mapping, every family's
SAMPLERS = {**CASES, **nemotron_cases.SAMPLERS}

#: Why a fragile case's mismatch is reported and not failed (the fixture READMEs' "fragility flags").
FRAGILE = ("fragile: the reference's own tokens change under 1e-4 of logit noise, so they are exact only "
           "where this CPU's float32 kernels round as the reference's did")


@dataclass
class Result:
    """One case: ``ok`` when every comparison held; ``errors`` say which did not.

    ``fragile`` marks a case its fixture flags ``robust_to_logit_noise.same_outputs: false``: the
    reference gave other tokens under +-1e-4 of noise on its logits, so rounding differences between
    CPUs (one ulp in a matrix product) change them too; its mismatch is a ``diff``, not a failure."""

    fixture: str
    name: str
    errors: list[str] = field(default_factory=list)
    note: str = ""
    fragile: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def failed(self) -> bool:
        return not self.ok and not self.fragile

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL" if self.failed else "diff"
        detail = "; ".join(self.errors + ([FRAGILE] if not self.failed and not self.ok else [])) or self.note
        return f"{status} {self.fixture}: {self.name}" + (f" ({detail})" if detail else "")


def _engine(folder: Path, cases: dict, device: str | None, model: str | Path | None = None) -> LLMEngine:
    """The engine on the fixture's checkpoint, or on ``model`` (the same weights in another form: a
    GGUF file written from the fixture) checked against the fixture's recorded runs."""
    config = checkpoint_config(resolve_checkpoint(model or folder))
    overrides = {}
    if "mask_token_id" not in config and "mask_token_id" in cases:       # LLaDA2's lives in its tokenizer
        overrides["mask_token_id"] = cases["mask_token_id"]
    # Cases rerun the same prompts; shared prefixes would only save passes the reference counts.
    return LLMEngine(EngineConfig(str(model or folder), device=device or "cpu", dtype="float32",
                                  config_overrides=overrides, prefix_caching=False))


def _generate(engine: LLMEngine, run: Run, replay: bool) -> list:
    recorded = run.recorded or [None] * len(run.prompts)
    ids = []
    for i, (p, params, draws) in enumerate(zip(run.prompts, run.params, recorded)):
        seq = engine.admit(p, params)
        if i < len(run.prepare) and run.prepare[i] is not None:
            run.prepare[i](seq, engine)             # a recorded starting canvas, before it is queued
        engine.enqueue(seq, draws=draws if replay else None)
        ids.append(seq.request_id)
    outputs: dict = {}
    while engine.has_unfinished:
        for chunk in engine.step():
            if chunk.finished:
                if chunk.error:
                    raise DLMError(chunk.error)
                outputs[chunk.request_id] = chunk.output
    return [outputs[i] for i in ids]


def _case_name(i: int, case: dict) -> str:
    return f"#{i} {case.get('name') or case['sampler']}" + (f" [{case['purpose']}]" if "purpose" in case else "")


def check_fixture(folder: str | Path, replay: bool = False, device: str | None = None,
                  model: str | Path | None = None) -> list[Result]:
    """Every case and forward tensor of one fixture folder, as :class:`Result` s; ``model``: run these
    weights in another form (a GGUF file) instead of the folder's own."""
    folder = Path(folder)
    if not (folder / "cases.json").is_file():
        raise CheckpointError(f"{folder}: no cases.json; a parity fixture is a checkpoint folder with cases.json "
                              "and expected_logits.safetensors (see the fixture READMEs).")
    cases = json.loads((folder / "cases.json").read_text())
    engine = _engine(folder, cases, device, model)
    results = []
    # The references ran float32 on CPU with one thread. Two threads split sums differently (1 ulp),
    # and a 48-step self-conditioned DiffusionGemma run amplifies that into other tokens.
    threads = torch.get_num_threads()
    if engine.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        for i, case in enumerate(cases["cases"]):
            mapping = SAMPLERS.get(case.get("sampler"))
            if mapping is None:
                results.append(Result(folder.name, _case_name(i, case),
                                      [f"no engine mapping for reference sampler {case.get('sampler')!r}"]))
                continue
            run = mapping(case, cases)
            try:
                errors = run.check(_generate(engine, run, replay))
            except DLMError as exc:
                errors = [f"the engine refused or failed: {exc}"]
            replayed = replay and any(run.recorded)
            results.append(Result(folder.name, _case_name(i, case), errors,
                                  "; ".join(filter(None, [run.note, "replayed draws" if replayed else ""])),
                                  fragile=not case.get("robust_to_logit_noise", {}).get("same_outputs", True)))
        logits = folder / "expected_logits.safetensors"
        if logits.is_file():
            for check in fixture_checks(engine.model, cases, load_file(str(logits)), engine.device):
                results.append(Result(folder.name, f"forward: {check.name}", check.errors))
    finally:
        torch.set_num_threads(threads)
        engine.close()                                 # the weights and KV pool go back to the allocator
    return results


def main(folders: list[str], replay: bool = False, device: str | None = None, echo=print,
         model: str | None = None) -> int:
    """Check every folder, one line per case and a closing count; the exit code is 1 on any mismatch
    of a case that is not fragile. ``model``: one folder's weights in another form (a GGUF file)."""
    if model is not None and len(folders) != 1:
        raise DLMError("--model checks one fixture folder's cases on other weights: name exactly one folder.")
    results = []
    for folder in folders:
        for result in check_fixture(folder, replay, device, model):
            echo(result.line())
            results.append(result)
    exact, differ = sum(r.ok for r in results), sum(not r.ok and not r.failed for r in results)
    echo(f"{exact}/{len(results)} cases exact" + (f"; {differ} fragile case(s) differ" if differ else ""))
    return 0 if results and not any(r.failed for r in results) else 1
