"""The ``dlm`` command: demo, generate, chat, serve, models, plugins, parity."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import fields

from dlm_backend.engine.engine_config import EngineLimits
from dlm_backend.engine.kv.sizing import CPU_KV_BYTES, GPU_KV_FRACTION
from dlm_backend.engine.quant.methods import METHODS
from dlm_backend.errors import DLMError
from dlm_backend.server.settings import ServerConfig


def _add_model_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("model", nargs="?", default=None,
                       help="checkpoint folder or hub id (default: $DLM_MODEL or the embedded dlm-tiny)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="split the model over N devices (GPUs; on CPU, N processes over gloo); under torchrun, "
                        "N = nodes x processes per node (default: 1)")
    # The choices and their help come from the methods table, so a new method needs no edit here
    # (argparse %-formats help text: a "%" in a description is escaped).
    methods = "; ".join(f"{name}: {what}" for name, what in METHODS.items()).replace("%", "%%")
    p.add_argument("--quantization", choices=list(METHODS), default=None,
                   help=f"quantize a full-precision checkpoint's weights as they load: {methods} "
                        "(default: the checkpoint's own precision)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """One flag per knob of the knob table; unset, a knob takes the checkpoint's default
    (generation_config.json's dlm_sampling) where it may set one, else the table's."""
    from dlm_backend.engine.params import DEFAULTS, KNOBS

    g = p.add_argument_group("decoding knobs")
    for name, knob in KNOBS.items():
        default = getattr(DEFAULTS, name)
        shown = f"{knob.doc}; default {'the checkpoint' + chr(39) + 's, else ' if knob.checkpoint else ''}{default!r}"
        flag = "--" + name.replace("_", "-")
        if knob.kind is bool:
            g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=shown)
        elif knob.kind is list:
            g.add_argument(flag, dest=name, action="append", type=knob.item, default=None,
                           help=shown + " (repeatable)")
        else:
            g.add_argument(flag, dest=name, type=knob.kind, choices=knob.choices, default=None, help=shown)


def _params(args, llm):
    from dlm_backend.chat import request_params
    from dlm_backend.engine.params import KNOBS

    return request_params(llm, {k: getattr(args, k) for k in KNOBS}, where="command line")


def _llm(args):
    from dlm_backend import LLM

    return LLM(args.model, device=args.device, dtype=args.dtype, tensor_parallel_size=args.tensor_parallel_size,
               quantization=args.quantization)


def cmd_generate(args) -> int:
    if len(args.args) > 2:
        raise DLMError("dlm generate takes [MODEL] PROMPT; quote a prompt that has spaces.")
    args.model, args.prompt = (None, args.args[0]) if len(args.args) == 1 else args.args
    llm = _llm(args)
    params = _params(args, llm)
    use_chat = not args.raw and llm.engine.tokenizer is not None and llm.engine.tokenizer.chat_template
    if use_chat:
        chunks = llm.stream_chat([{"role": "user", "content": args.prompt}], params)
    else:
        chunks = llm.stream(args.prompt, params)
    output = None
    for chunk in chunks:
        sys.stdout.write(chunk.delta_text)
        sys.stdout.flush()
        output = chunk.output or output
    sys.stdout.write("\n")
    if args.stats and output is not None:
        n = max(output.num_generated_tokens, 1)
        print(json.dumps({"finish_reason": output.finish_reason, "forward_passes": output.num_forward_passes,
                          "tokens": output.num_generated_tokens,
                          "tokens_per_pass": round(n / max(output.num_forward_passes, 1), 3),
                          "latency_s": round(output.metrics["latency_s"], 4)}), file=sys.stderr)
    return 0


def cmd_chat(args) -> int:
    llm = _llm(args)
    params = _params(args, llm)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            sys.stdout.write(">>> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        reply = ""
        for chunk in llm.stream_chat(messages, params):
            sys.stdout.write(chunk.delta_text)
            sys.stdout.flush()
            reply += chunk.delta_text
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})


def _secret(flag_value: str | None, file: str | None, env: str, flag: str) -> str | None:
    """A key from ``--<flag>-file`` (its first line), else the ``--<flag>`` flag, else ``$<env>``; a
    key given as a flag is visible to every user of the machine in ``ps``, so that warns."""
    if file is not None:
        if flag_value is not None:
            raise DLMError(f"Give the key once: --{flag} or --{flag}-file, not both.")
        try:
            with open(file, encoding="utf-8") as f:
                key = f.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise DLMError(f"--{flag}-file {file!r} cannot be read ({exc.strerror or exc}); give a readable "
                           "file whose first line is the key.") from None
        if not key:
            raise DLMError(f"--{flag}-file {file!r} is empty; its first line must be the key.")
        return key
    if flag_value:
        logging.getLogger("dlm_backend.server").warning(
            "--%s puts the key on the command line, where every user of this machine can read it (ps, "
            "/proc) and shell history keeps it; set $%s or use --%s-file instead.", flag, env, flag)
        return flag_value
    return os.environ.get(env) or None


def cmd_serve(args) -> int:
    import uvicorn

    from dlm_backend.engine.forward.workers import worker_rank
    from dlm_backend.server import create_app
    from dlm_backend.server.connections import GuardedH11Protocol
    from dlm_backend.server.settings import LOOPBACK_NAMES

    api_key = _secret(args.api_key, args.api_key_file, "DLM_API_KEY", "api-key")
    metrics_key = _secret(None, args.metrics_key_file, "DLM_METRICS_KEY", "metrics-key")
    loopback = args.host in LOOPBACK_NAMES
    if not loopback and not api_key:
        if not args.allow_unauthenticated:
            raise DLMError(f"Serving on {args.host} without an API key lets anyone who can reach this port use "
                           "the model. Set $DLM_API_KEY (or --api-key-file), or pass --allow-unauthenticated if "
                           "that is intended.")
        logging.getLogger("dlm_backend.server").warning(
            "--allow-unauthenticated: serving on %s:%d without an API key; anyone who can reach this port can use "
            "the model%s.", args.host, args.port, "" if metrics_key else " and read /metrics")
    limits = {f.name: getattr(args, f.name) for f in fields(EngineLimits) if getattr(args, f.name) is not None}
    config = ServerConfig(model=args.model, served_name=args.served_model_name, device=args.device,
                          dtype=args.dtype, api_key=api_key, metrics_key=metrics_key,
                          max_body_bytes=args.max_body_bytes, max_tokens_limit=args.max_tokens_limit,
                          max_prompt_tokens=args.max_prompt_tokens, limits=limits,
                          kv_cache_memory=args.kv_cache_memory, prefix_caching=args.prefix_caching,
                          tensor_parallel_size=args.tensor_parallel_size, quantization=args.quantization,
                          allowed_hosts=list(LOOPBACK_NAMES) if loopback and not api_key else None)
    app = create_app(config=config)
    if not args.lazy or worker_rank():    # a torchrun worker rank serves (and exits) in start()
        app.state.served.start()          # load before accepting connections; a DLMError says why it cannot
        # uvicorn runs at log level warning, so this line is what says the model is up and what it took.
        print(f"dlm serve: {app.state.served.summary()}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", http=GuardedH11Protocol)
    return 0


def cmd_demo(args) -> int:
    from dlm_backend.demo import main as demo

    demo()
    return 0


def cmd_models(args) -> int:
    from dlm_backend.engine.models.registry import supported_architectures

    for arch, target in supported_architectures().items():
        print(f"{arch:24} {target}")
    return 0


def cmd_parity(args) -> int:
    from dlm_backend.parity import main as parity

    return parity(args.folders, replay=args.replay, device=args.device, model=args.model)


def cmd_plugins(args) -> int:
    from dlm_backend.plugins import (plugin_listing, registered_adapters, registered_knobs, registered_samplers,
                                     registered_schedules)

    schedules = {name: f"{cls.__module__}:{cls.__qualname__}" for name, cls in sorted(registered_schedules().items())}
    print(json.dumps({"plugins": plugin_listing(), "samplers": sorted(registered_samplers()),
                      "knobs": {name: knob.doc for name, knob in sorted(registered_knobs().items())},
                      "schedules": schedules, "adapters": registered_adapters()}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dlm_backend.plugins import load_plugins

    parser = argparse.ArgumentParser(prog="dlm", description="Masked-diffusion LMs on a local engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="the embedded model at each front door: a LangChain agent, LlamaIndex RAG, "
                   "structured output, the openai client; answers and passes per token").set_defaults(func=cmd_demo)
    p = sub.add_parser("generate", help="answer one prompt, streaming committed text: dlm generate [MODEL] PROMPT")
    _add_model_args(p, positional=False)
    p.add_argument("args", nargs="+", metavar="[MODEL] PROMPT")
    p.add_argument("--raw", action="store_true", help="no chat template: complete the text as is")
    p.add_argument("--stats", action="store_true", help="print passes and latency to stderr")
    _add_sampling_args(p)
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("chat", help="interactive chat on stdin (/exit to quit)")
    _add_model_args(p)
    p.add_argument("--system", default=None, help="system message")
    _add_sampling_args(p)
    p.set_defaults(func=cmd_chat)
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (127.0.0.1 unless told otherwise)")
    _add_model_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) requests may use for the model (default: its folder name); others get 404")
    p.add_argument("--lazy", action="store_true", help="load the model on the first request")
    p.add_argument("--api-key", default=None, help="require this bearer key on every route but /health; "
                   "visible in ps: prefer $DLM_API_KEY or --api-key-file (none = open, fine on 127.0.0.1)")
    p.add_argument("--api-key-file", default=None, metavar="PATH", help="read the API key from this file's first line")
    p.add_argument("--metrics-key-file", default=None, metavar="PATH",
                   help="require this file's first line as the key of /metrics instead of the API key "
                        "(default: $DLM_METRICS_KEY; its prefix cache counters show what prompts were sent)")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve on a non-loopback --host without an API key (refused otherwise; warns)")
    defaults = ServerConfig()
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes, help="larger request bodies get 413")
    p.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens_limit,
                   help="largest max_tokens a request may ask")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt (default: the context)")
    p.add_argument("--kv-cache-memory", type=int, default=None, metavar="BYTES",
                   help=f"KV cache shared by all requests (default: {GPU_KV_FRACTION * 100:.0f}%% of the GPU memory "
                        f"left after the weights, {CPU_KV_BYTES / 2**30:g} GiB on CPU); requests wait for free pages")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share the keys and values of identical prompt prefixes (default: on)")
    for f in fields(EngineLimits):          # the engine's limits, with their defaults, stated once there
        p.add_argument("--" + f.name.replace("_", "-"), type=int, default=None,
                       help=f"engine limit (default: the engine's own; on a fresh engine "
                            f"{f.default if f.default is not None else 'the model context'})")
    p.set_defaults(func=cmd_serve)
    sub.add_parser("models", help="list supported architectures").set_defaults(func=cmd_models)
    sub.add_parser("plugins", help="list loaded plugins, samplers, plugin knobs and schedules").set_defaults(
        func=cmd_plugins)
    p = sub.add_parser("parity", help="check the engine against a fixture folder's recorded reference runs")
    p.add_argument("folders", nargs="+", metavar="FIXTURE_DIR",
                   help="checkpoint folder with cases.json and expected_logits.safetensors")
    p.add_argument("--replay", action="store_true",
                   help="hand the engine the random draws a sampled reference run recorded (default: same seed)")
    p.add_argument("--device", default=None, help="cpu (default) or cuda")
    p.add_argument("--model", default=None, metavar="FILE.gguf",
                   help="run the one fixture's cases on these weights instead of its own (a GGUF file written from it)")
    p.set_defaults(func=cmd_parity)
    load_plugins().hook.register_commands(subparsers=sub)
    return parser


def _unknown_option(parser: argparse.ArgumentParser, option: str) -> str:
    """The error for an option no command declares, naming the nearest one (a misspelled knob)."""
    import difflib

    known = {o for action in parser._subparsers._group_actions for sub in action.choices.values()
             for a in sub._actions for o in a.option_strings}
    near = difflib.get_close_matches(option.split("=")[0], sorted(known), n=1, cutoff=0.6)
    return f"unknown option {option!r}." + (f" Did you mean {near[0]!r}?" if near else " See `dlm COMMAND --help`.")


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()                    # plugins add commands: a broken one is an error line
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            raise DLMError(_unknown_option(parser, unknown[0]))
        return args.func(args)
    except DLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:       # `dlm generate ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
