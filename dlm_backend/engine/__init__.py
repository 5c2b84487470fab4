"""The diffusion decoding engine: scheduler, runner, models, samplers and caches."""
