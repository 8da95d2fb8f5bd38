"""Evaluations of what the model's output buys (`arrcoc eval ...`)."""
