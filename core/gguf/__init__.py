"""GGUF container reader."""

from ..base.gguf_constants import FileType, ValueType, file_type_name
from ..shardnames import shard_path, shard_prefix, sibling_shards
from .errors import GGUFError, NeedMoreBytes
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
    "NeedMoreBytes",
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
