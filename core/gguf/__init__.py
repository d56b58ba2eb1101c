"""GGUF container reader."""

from ..shardnames import shard_path, shard_prefix, sibling_shards
from .constants import FileType, ValueType, file_type_name
from .errors import GGUFError
from .reader import (
    GGUFFile,
    MetadataValue,
    ShardError,
    ShardInfo,
    TensorInfo,
    open_gguf,
)
from .strings import StringArray

__all__ = [
    "FileType",
    "GGUFError",
    "GGUFFile",
    "MetadataValue",
    "ShardError",
    "ShardInfo",
    "StringArray",
    "TensorInfo",
    "ValueType",
    "file_type_name",
    "open_gguf",
    "shard_path",
    "shard_prefix",
    "sibling_shards",
]
