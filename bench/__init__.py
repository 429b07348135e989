"""Benchmarks; see BENCHMARKS.md at the repo root."""
