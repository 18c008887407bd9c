"""Operator reduction and the trimmed runtime (see the minimal-build issue); reads the op table, not kernels."""
