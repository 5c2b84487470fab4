"""Opening a checkpoint: finding its folder (folder.py), reading its files inside it (files.py), the
weights into the model (weights.py), the tokenizer and the sandboxed chat template with its limits
(tokenizer.py, chat_template.py, template_limits.py), and everything an engine needs from it,
opened and checked in one place (load.py)."""
