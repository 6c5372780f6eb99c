"""Collection: run perf (and later probes), read /proc and ELF files, write run archives."""
