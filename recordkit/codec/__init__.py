"""Payload codecs: the ``tf.train.Example`` and ``tf.train.SequenceExample`` wire formats,
the schemas, per-feature zstd."""

from .compression import zstd_compress, zstd_decompress
from .example import KINDS, decode_example, encode_example
from .limits import DEFAULT_BATCH_BYTES, DEFAULT_RECORD_BYTES, DecodeBudget, DecodeLimits
from .schema import Bytes, FeatureType, Float32, Int64, Schema, Tensor
from .schema_text import parse_schema
from .sequence import SequenceSchema, decode_sequence_example

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_RECORD_BYTES",
    "KINDS",
    "Bytes",
    "DecodeBudget",
    "DecodeLimits",
    "FeatureType",
    "Float32",
    "Int64",
    "Schema",
    "SequenceSchema",
    "Tensor",
    "decode_example",
    "decode_sequence_example",
    "encode_example",
    "parse_schema",
    "zstd_compress",
    "zstd_decompress",
]
