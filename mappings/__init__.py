"""Shipped mapping files (TOML data, never code). Read by qprof.attribution.mapping."""
