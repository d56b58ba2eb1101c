"""Inference engine: sessions with a KV cache and the forward pass on native kernels."""

from .session import ContextFull, InferenceSession, Model, Session

__all__ = ["ContextFull", "InferenceSession", "Model", "Session"]
