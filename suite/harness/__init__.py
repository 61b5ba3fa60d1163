"""Layered model, families, data, keyed rng, masking, optimizers, loss scale, device; imports suite.config."""
