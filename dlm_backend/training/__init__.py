"""Training the embedded model: synthetic corpus, tokenizer, masked-diffusion SFT, evaluation."""
