"""GGUF container reader."""

from .constants import FileType, ValueType, file_type_name
from .errors import GGUFError
from .reader import GGUFFile, MetadataValue, TensorInfo, open_gguf
from .strings import StringArray

__all__ = [
    "FileType",
    "GGUFError",
    "GGUFFile",
    "MetadataValue",
    "StringArray",
    "TensorInfo",
    "ValueType",
    "file_type_name",
    "open_gguf",
]
