"""The five categories of the founding study; every sample lands in exactly one."""

from __future__ import annotations

PACKET_IO = "Packet I/O"
CRYPTO = "Crypto"
CONNECTION = "Connection Mgmt"
IO = "I/O"
UNCATEGORIZED = "Uncategorized"

CATEGORIES: tuple[str, ...] = (PACKET_IO, CRYPTO, CONNECTION, IO, UNCATEGORIZED)
