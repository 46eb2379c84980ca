"""Baselines that answer differently from a memory policy over one continuing cache (DESIGN §3)."""
