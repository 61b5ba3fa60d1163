"""GLUE data and metrics, tokenizer, corpus, fine-tuning, pre-training, checkpoints; imports core and below."""
