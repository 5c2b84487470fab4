"""What one ``dlm serve`` is: its model, names, limits and security (no web framework imported)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dlm_backend.engine.checkpoint.folder import default_model
from dlm_backend.engine.engine_config import EngineConfig, EngineLimits
from dlm_backend.engine.params import unknown_field

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class ServerConfig:
    """Model, limits and security of one server.

    ``limits`` are the engine limits this server sets on the shared engine (EngineLimits fields; an
    EngineLimits sets them all). Limits it leaves out keep the engine's: another front door's on an
    engine already running, else EngineLimits' defaults. The server's slots follow the engine's.
    """

    model: str | None = None
    served_name: str | list[str] | None = None   # name(s) clients use; default: the model folder's name
    device: str | None = None
    dtype: str = "auto"                     # auto: bf16 on GPU, fp32 on CPU
    api_key: str | None = None              # required on every route but /health when set
    #: required on /metrics instead of the API key when set: the prefix cache counters there tell a
    #: reader whether a prompt prefix was sent before, so scrapers get a key clients do not
    metrics_key: str | None = None
    max_body_bytes: int = 1 << 20           # 1 MiB: a long RAG prompt is ~100 KB
    max_tokens_limit: int = 4096            # largest max_tokens a request may ask for
    max_prompt_tokens: int | None = None    # default: the model's context minus max_tokens
    limits: dict[str, int] | EngineLimits = field(default_factory=dict)
    kv_cache_memory: int | None = None      # bytes of KV pages (default: the engine's, see EngineConfig)
    prefix_caching: bool | None = None      # share identical prompt prefixes (default: on)
    tensor_parallel_size: int | None = None  # devices the model splits over (default: one)
    quantization: str | None = None         # a METHODS name (engine/quant), applied on load (default: none)
    #: Host header values accepted when no API key is set (DNS rebinding: a web page's script can
    #: reach a loopback server under its own host name); None checks nothing.
    allowed_hosts: list[str] | None = field(default_factory=lambda: list(LOOPBACK_NAMES))

    def __post_init__(self):
        # Checked here so that a bad limit fails when the server starts, even with --lazy.
        self.limits = dict(vars(self.limits)) if isinstance(self.limits, EngineLimits) else dict(self.limits)
        names = [f.name for f in fields(EngineLimits)]
        for name in self.limits:
            if name not in names:
                raise unknown_field(name, names, "server limit", kind="limits")
        EngineLimits(**{**vars(EngineLimits()), **{k: v for k, v in self.limits.items() if v is not None}})
        # The engine's own checks of what this server builds it from (dtype, device, KV budget, devices,
        # quantization method), so a bad value stops the server at start, even with --lazy.
        EngineConfig(model=self.model or "", device=self.device, dtype=self.dtype, kv_cache_memory=self.kv_cache_memory,
                     tensor_parallel_size=self.tensor_parallel_size or 1, quantization=self.quantization)

    @property
    def served_names(self) -> list[str]:
        names = [self.served_name] if isinstance(self.served_name, str) else list(self.served_name or [])
        return names or [(self.model or default_model()).rstrip("/").split("/")[-1]]
