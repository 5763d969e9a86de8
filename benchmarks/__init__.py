"""Benchmark scripts (run from the repository root; each prints a markdown table)."""
