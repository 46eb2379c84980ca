"""hermes-video: streaming video question answering with a hierarchical KV memory (HERMES)."""

__version__ = "0.1.0"
