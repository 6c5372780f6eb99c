"""Viewers: render an attributed profile for people (terminal, flame graphs, diffs) and programs (JSON,
folded stacks, speedscope)."""
