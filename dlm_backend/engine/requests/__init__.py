"""One request decoded pass by pass: what every request has (sequence.py), how each kind of family
decodes it (canvas_sequence.py, block_sequence.py, uniform_sequence.py), its committed text and stop
strings (detokenizer.py), and the checks it passes before it is queued (admission.py)."""
