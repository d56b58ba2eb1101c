"""Inference engine: sessions with a KV cache and the forward pass on native kernels."""

from .session import ContextFull, Model, Session

__all__ = ["ContextFull", "Model", "Session"]
