"""Measurement code: every `hermes-video bench` suite, beside the runtime it measures and never
imported by it; its modules: docs/ARCHITECTURE.md, Performance."""
