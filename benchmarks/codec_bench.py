"""Example codec speed: recordkit's hand-written codec vs the protobuf runtime.

Two workloads, one record each, timed per record (best of several runs):

- ``big``: one 256 KiB bytes value and an int64 label (an image-like sample);
- ``small``: a 1 KiB bytes value, an int64 label and 16 float32s.

"decode" for protobuf is ``example_pb2.Example.FromString`` followed by turning
the lists into what recordkit returns (numpy arrays, the bytes values), so both
sides end with the same usable values. Needs TensorFlow (or just ``protobuf``
with TensorFlow's generated ``example_pb2``) for the peer column.

Run: ``python benchmarks/codec_bench.py [--number N]``.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

from recordkit.codec import Bytes, Float32, Int64, Schema, decode_example, encode_example


def _workloads() -> dict[str, dict[str, tuple[str, Any]]]:
    rng = np.random.default_rng(0)
    return {
        "big": {
            "image": ("bytes", [rng.bytes(256 << 10)]),
            "label": ("int64", 917),
        },
        "small": {
            "image": ("bytes", [rng.bytes(1 << 10)]),
            "label": ("int64", 3),
            "embedding": ("float", rng.standard_normal(16).astype(np.float32)),
        },
    }


def _protobuf(features: dict[str, tuple[str, Any]]) -> tuple[Callable[[], Any], ...]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out
    from tensorflow.core.example import example_pb2, feature_pb2

    def encode() -> bytes:
        feature = {}
        for name, (kind, values) in features.items():
            if kind == "bytes":
                feature[name] = feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=values))
            elif kind == "int64":
                ints = np.atleast_1d(values).tolist()
                feature[name] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=ints))
            else:
                floats = np.asarray(values).tolist()
                feature[name] = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=floats))
        example = example_pb2.Example(features=feature_pb2.Features(feature=feature))
        return example.SerializeToString()

    payload = encode()

    def decode() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, feature in example_pb2.Example.FromString(payload).features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind == "bytes_list":
                out[name] = list(feature.bytes_list.value)
            elif kind == "int64_list":
                out[name] = np.array(feature.int64_list.value, np.int64)
            else:
                out[name] = np.array(feature.float_list.value, np.float32)
        return out

    return encode, decode


def _per_record_us(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="records per timing run")
    args = parser.parse_args()
    schemas = {
        "big": Schema(image=Bytes(), label=Int64()),
        "small": Schema(image=Bytes(), label=Int64(), embedding=Float32((16,))),
    }
    rows = []
    for name, features in _workloads().items():
        payload = encode_example(features)
        sample = {k: (v[0] if k == "image" else v) for k, (_, v) in features.items()}
        schema = schemas[name]
        ours = {
            "encode_example": lambda f=features: encode_example(f),
            "decode_example": lambda p=payload: decode_example(p),
            "Schema.encode": lambda s=schema, x=sample: s.encode(x),
            "Schema.decode": lambda s=schema, p=payload: s.decode(p),
        }
        try:
            pb_encode, pb_decode = _protobuf(features)
            peer = {"encode": _per_record_us(pb_encode, args.number)}
            peer["decode"] = _per_record_us(pb_decode, args.number)
        except ImportError:
            peer = {}
        for op, fn in ours.items():
            us = _per_record_us(fn, args.number)
            ref = peer.get("encode" if "encode" in op else "decode")
            ratio = f"{ref / us:7.1f}x" if ref else "      -"
            ref_s = f"{ref:10.2f}" if ref else "         -"
            rows.append(f"{name:6} {op:15} {us:10.2f} {ref_s} {ratio}")
    print(f"{'load':6} {'operation':15} {'ours µs':>10} {'protobuf µs':>10} {'speedup':>8}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
