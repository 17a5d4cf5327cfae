"""Evaluation: benchmarks against MuJoCo, metrics, comparisons (more to come)."""
