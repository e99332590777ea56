"""Runtimes: Anakin (fused, on device)."""
