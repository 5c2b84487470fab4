"""The recipe that trained dlm_backend's embedded dlm-tiny: synthetic corpus, tokenizer, built copy
circuits, masked-diffusion SFT (`dlm train`) and the held-out evaluation (`dlm eval`).

A dlm_backend plugin: ``pip install -e recipes/dlm_tiny`` registers both commands through the
``dlm_backend`` entry-point group (:mod:`dlm_tiny.commands`)."""
