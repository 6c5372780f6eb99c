"""Markers on a record's fields saying how the archive writes them (archive.schema reads them).

Here, below the archive, because some of the probes' own records go into it as they are: a libbpf
loader's config (probes.libbpf.LoaderConfig), what the crypto group found (probes.crypto.records).
"""

from __future__ import annotations

# A field `X | None` only because older archives lack it: absent is allowed, null is refused, and a
# record leaving it None is written without it.
NEVER_NULL = {"never_null": True}

# A map field whose older archives wrote null for "nothing here" (a process gone when its cgroup was
# read): null values are accepted and read as absent; the writer leaves such keys out.
NULL_IS_ABSENT = {"null_is_absent": True}

# A record field whose fields are written beside its parent's, not under a key of its own (the
# byte totals, which proc.jsonl has always held at the top level of a reading).
INLINE = {"inline": True}
