"""Viewers: render an attributed profile for people (terminal) and programs (JSON)."""
