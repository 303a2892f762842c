"""Helpers for testing PEARL against real SGLang and the emulator (tiny models, servers)."""
