"""Go's function table is read in the probes layer (qprof.probes.gopclntab), the lowest layer both its readers
may import: the crypto probes' symbol discovery and collectors.debuginfo. This name stays only until
collectors.debuginfo imports it from there."""

from qprof.probes.gopclntab import SECTIONS, GoFunctions, parse, read

__all__ = ["SECTIONS", "GoFunctions", "parse", "read"]
