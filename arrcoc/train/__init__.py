"""Training the default weights: procedural captioned scenes, cached tensors, trainer, pointing game."""
