"""Kernel-side facilities: what this kernel offers, and the probe programs that use it."""
