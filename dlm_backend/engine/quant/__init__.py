"""Quantized weights: the forms a quantized linear weight takes in the engine (integer groups, FP8),
the checkpoint formats that hold them (``formats/``: GPTQ, AWQ, compressed-tensors, block FP8) and
on-the-fly quantization of full-precision checkpoints (``methods``). Nothing here knows a model
family: layers name the parameters they let be quantized (``quantized_params``)."""
