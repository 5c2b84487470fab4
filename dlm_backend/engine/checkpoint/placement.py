"""Each checkpoint tensor into its place in a model built on the meta device: checked against the
model's shape, sliced for this rank, stacked with its sibling experts, quantized when asked, and
every tensor accounted for (a missing, unexpected or misshapen one is an error naming it)."""

from __future__ import annotations

from pathlib import Path

import torch

from dlm_backend.engine.checkpoint.sources import Entry
from dlm_backend.engine.layers.parallel import Sharded
from dlm_backend.engine.layers.routers import StackedExperts
from dlm_backend.engine.models.base import DiffusionLM
from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.methods import HEAD_METHODS, install, is_head, quantizable, quantize_stack, quantize_weight
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import CheckpointError

#: Tensors some exports carry that no implementation needs: rotary tables recomputed at load, and
#: (for a tied model) a copy of the embedding saved as the head.
HARMLESS_EXTRAS = ("rotary_emb.inv_freq",)
HEADS = ("lm_head.weight", "transformer.ff_out.weight")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


class Placement:
    """The tensors of one load, gathered for ``model`` in ``dtype`` (on ``target``)."""

    def __init__(self, model: DiffusionLM, dtype: torch.dtype, target: str, quantization: str | None):
        self.model, self.dtype, self.target, self.method = model, dtype, target, quantization
        self.expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        # Layers holding one rank's part of a tensor (none on one device), and the partitioned experts.
        self.shards = {n: m for n, m in model.named_modules() if isinstance(m, Sharded) and m.tp is not None}
        self.experts = {n: m for n, m in model.named_modules() if isinstance(m, StackedExperts) and m.tp is not None}
        self.targets = quantizable(model)                   # parameters a quantized weight may replace
        self.state: dict[str, torch.Tensor] = {}
        self.quantized: dict[str, QuantizedWeight | QuantizedExperts] = {}
        self.stacked: dict[str, set[int]] = {}              # float stacked parameter -> indices filled
        self.qstacks: dict[str, dict[int, QuantizedWeight]] = {}
        self.shape_errors: list[str] = []
        self.unexpected: list[str] = []

    def add(self, entry: Entry) -> None:
        name, shape, expected = entry.name, entry.shape, self.expected
        into = self.model.stacked_name(name) if name not in expected else None
        if into is not None and into[0] in expected:
            into = self._local_expert(into, name, shape)
            if into is not None:
                self._stack(into, entry)
            return
        owner, _, param = name.rpartition(".")
        if name in expected and owner in self.experts:
            self._expert_stack(entry, self.experts[owner])
            return
        if name in expected and owner in self.shards:
            full = self.shards[owner].full_shape(param)
            if shape != full:
                self.shape_errors.append(f"{name}: expected {list(full)}, found {list(shape)}")
            elif self.method is not None and name in self.targets and not self._head(name):
                # Quantized whole, then split: every rank holds a slice of the one quantized weight, so
                # a split engine runs the weights a one-device engine runs (per-channel scales would
                # otherwise come from each rank's columns only).
                shard = self.shards[owner].load_shard
                self.quantized[name] = (shard(param, quantize_weight(entry.read(), self.method)) if len(shape) == 2
                                        else quantize_stack(shard(param, entry.part()), self.method))  # experts whole
            else:
                self._put(name, self.shards[owner].load_shard(param, entry.part()))
            return
        if name not in expected:
            self.unexpected.append(name)
        elif shape != expected[name]:
            self.shape_errors.append(f"{name}: expected {list(expected[name])}, found {list(shape)}")
        else:
            self._put(name, entry.read())

    def _head(self, name: str) -> bool:
        return is_head(self.targets[name][0])

    def _put(self, name: str, value) -> None:
        target = name in self.targets
        if isinstance(value, (QuantizedWeight, QuantizedExperts)):
            if target and not self._head(name):
                self.quantized[name] = value
            else:       # a quantized embedding or head (GGUF's Q6_K output.weight): kept in float, as published
                self.state[name] = value.dequantize(self.dtype)
            return
        method = None if not target or self.method is None else \
            HEAD_METHODS[self.method] if self._head(name) else self.method
        if method is None:
            self.state[name] = value.to(self.dtype)
        else:           # a head is quantized after its split: its per-row scales do not depend on it
            self.quantized[name] = (quantize_weight if value.dim() == 2 else quantize_stack)(value, method)

    def _local_expert(self, into, name, shape) -> tuple[str, int] | None:
        """``into`` with the expert's index on this rank; None when another rank holds it (or it is out
        of the checkpoint's range: an error recorded). Unchanged on one device."""
        param, index = into
        module = self.experts.get(param.rpartition(".")[0])
        if module is None:
            return into
        full = (module.mine.stop - module.mine.start) * module.tp.world
        if not 0 <= index < full:
            self.shape_errors.append(f"{name}: expected {list(self.expected[param][1:])} at index < {full}, "
                                     f"found {list(shape)}")
            return None
        local = module.local_index(index)
        return None if local is None else (param, local)

    def _expert_stack(self, entry: Entry, module: StackedExperts) -> None:
        """A whole ``[E, ...]`` stack (GGUF's ``ffn_*_exps``) under partitioned experts: this rank's."""
        want = self.expected[entry.name]
        full = ((module.mine.stop - module.mine.start) * module.tp.world, *want[1:])
        if entry.shape != full:
            self.shape_errors.append(f"{entry.name}: expected {list(full)}, found {list(entry.shape)}")
            return
        value = entry.read()[module.mine]                       # a tensor or a stack of quantized experts
        self._put(entry.name, value if isinstance(value, QuantizedExperts) else value.clone())

    def _stack(self, into: tuple[str, int], entry: Entry) -> None:
        """One per-expert tensor into its slice of the stacked parameter (allocated on first use), or
        into the stack of quantized experts."""
        param, index = into
        want = self.expected[param]
        if entry.shape != want[1:] or not 0 <= index < want[0]:
            self.shape_errors.append(f"{entry.name}: expected {list(want[1:])} at index < {want[0]}, "
                                     f"found {list(entry.shape)}")
            return
        value = entry.read()
        if isinstance(value, QuantizedWeight) or (self.method is not None and param in self.targets):
            q = value if isinstance(value, QuantizedWeight) else quantize_weight(value, self.method)
            self.qstacks.setdefault(param, {})[index] = q
            return
        if param not in self.state:
            self.state[param] = torch.empty(want, dtype=self.dtype, device=self.target)
            self.stacked[param] = set()
        self.state[param][index].copy_(value)
        self.stacked[param].add(index)

    def check(self, where: Path | str, cls_name: str, tied: bool) -> None:
        """Raise a CheckpointError for tensors without a place, with the wrong shape, or missing."""
        # A tensor the implementation has no place for would be dropped and the logits silently wrong
        # (e.g. LLaDA with include_bias: biases on every layer); only known leftovers are skipped.
        unexpected = [n for n in self.unexpected if not n.endswith(HARMLESS_EXTRAS) and not (tied and n.endswith(HEADS))]
        if unexpected:
            raise CheckpointError(f"Tensors in {where} that {cls_name} has no place for: {_shown(unexpected)}. The "
                                  "checkpoint is of another variant than its config.json says, or not supported.")
        errors = {n.split(": ")[0] for n in self.shape_errors}
        missing = sorted(set(self.expected) - set(self.state) - set(self.quantized) - set(self.qstacks) - errors)
        missing += [f"{n}[{i}]" for n, got in self.stacked.items() for i in range(self.expected[n][0]) if i not in got]
        missing += [f"{n}[{i}]" for n, got in self.qstacks.items() for i in range(self.expected[n][0]) if i not in got]
        if self.shape_errors:
            raise CheckpointError(f"Tensors with the wrong shape for {cls_name} in {where}: "
                                  f"{'; '.join(self.shape_errors[:8])}. The config.json and weights disagree: "
                                  "re-download the checkpoint or fix config.json.")
        if missing:
            raise CheckpointError(f"Tensors missing from {where} for {cls_name}: {_shown(missing)}. "
                                  "The checkpoint is incomplete or of another architecture: re-download it.")

    def finish(self, device: torch.device) -> None:
        """Assign the float tensors, install the quantized weights and lay them out for ``device``."""
        self.model.load_state_dict(self.state, assign=True, strict=False)
        for name, got in self.qstacks.items():
            self.quantized[name] = QuantizedExperts([got[i] for i in range(len(got))])
        for name, value in self.quantized.items():
            module, attr = self.targets[name]
            install(module, attr, value)
        for m in self.model.modules():
            if isinstance(m, QuantizedWeight):
                m.prepare(device, self.dtype)
        left = [n for n, t in (*self.model.named_parameters(), *self.model.named_buffers()) if t.is_meta]
        if left:        # a layer whose quantized form its module did not take up
            raise CheckpointError(f"{type(self.model).__name__}: {_shown(left)} were not filled from the checkpoint.")
