"""Real QUIC bulk-transfer endpoints for the tests: sources per stack, cached builds (build.py)."""
