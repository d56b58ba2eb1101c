"""Transitional: the type table moved to ``quantscope.core.base.ggml_types``. Only ``core/engine/cuda_backend.py``
(being split by issue 47 item 3) still imports this path; delete this module once its import points at the base."""

from ..base.ggml_types import GGMLType, ggml_type

__all__ = ["GGMLType", "ggml_type"]
