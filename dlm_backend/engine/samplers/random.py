"""A request's random draws, in one place, so a recorded stream can stand in for them.

Every sampler draws through :attr:`StepInput.random` (the request's one source of randomness), never
through a generator of its own: a seeded request then draws the same stream whatever the sampler,
and ``dlm parity`` can inject the draws a reference run recorded (:class:`ReplayRandom`) and check
that everything else the sampler does is the same math, token for token.
"""

from __future__ import annotations

import torch

from dlm_backend.errors import DLMError


class TorchRandom:
    """Draws from the request's seeded ``torch.Generator`` (each method is one torch call on it, so a
    reference seeded the same way and making the same calls draws the same numbers)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def multinomial(self, probs: torch.Tensor) -> torch.Tensor:
        """One sample per row of ``probs`` [N, V]: [N] int64."""
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]

    def sample(self, weights: torch.Tensor, k: int) -> torch.Tensor:
        """``k`` distinct indices of ``weights`` [N], drawn in proportion to them: [k] int64."""
        return torch.multinomial(weights, k, generator=self.generator)

    def randint(self, high: int, shape: tuple) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.generator, device=self.generator.device)

    def rand(self, shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Uniform [0, 1) of ``shape`` on the generator's device."""
        return torch.rand(shape, dtype=dtype, device=self.generator.device, generator=self.generator)


class ReplayRandom:
    """Draws recorded by a reference run, handed out in order; a draw of another kind or shape than
    the recording's next one means the run diverged, which is an error naming both."""

    def __init__(self, calls: list[dict], device="cpu"):
        self.calls, self.device, self.generator = list(calls), device, None

    def _next(self, op: str, n: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
        if not self.calls:
            raise DLMError(f"replay: the run asked for a {op} draw the recording does not have")
        call = self.calls.pop(0)
        if call["op"] != op or len(call["out"]) != n:
            raise DLMError(f"replay: the run asked for {op} x{n}, the recording has {call['op']} "
                           f"x{len(call['out'])}")
        return torch.tensor(call["out"], dtype=dtype, device=self.device)

    def multinomial(self, probs: torch.Tensor) -> torch.Tensor:
        return self._next("torch.multinomial", probs.shape[0])

    def sample(self, weights: torch.Tensor, k: int) -> torch.Tensor:
        return self._next("torch.multinomial", k)

    def randint(self, high: int, shape: tuple) -> torch.Tensor:
        return self._next("torch.randint", int(torch.tensor(shape).prod())).view(shape)

    def rand(self, shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._next("torch.rand", int(torch.tensor(shape).prod()), dtype).view(shape)
