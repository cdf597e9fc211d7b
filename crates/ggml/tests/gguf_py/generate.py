#!/usr/bin/env python3
"""Test vectors for qdrift-ggml's read-only GGML types, from gguf-py's numpy dequantizers.

Test-only; run by hand, not by the build. Produced with gguf 0.19.0 (PyPI `gguf`, llama.cpp's
gguf-py) and numpy 2.4.6:

    python3 -m venv /var/tmp/gguf-venv && /var/tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
    /var/tmp/gguf-venv/bin/python crates/ggml/tests/gguf_py/generate.py

For each type it writes `<type>.txt` beside this script: a few blocks of seeded random bytes, with
the f16 scale fields replaced by finite values (random magnitudes in [2^-14, 2^2), either sign;
the last block's `d` is an f16 subnormal), and the f32 values `gguf.quants.dequantize` gives
them. Format, one record per block:

    block <the block's bytes, hex>
    f32 <the block_size dequantized values as f32 bit patterns, 8 hex digits each, space-separated>

gguf-py computes each value with the same f32 operations in the same order as ggml's C
`dequantize_row_*` (one product, plus one addition or subtraction for q5_1/q2_K/q5_K), so its
results are bit-exact with the C; `crates/ggml/tests/gguf_py_vectors.rs` says so per type.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, quants

HERE = Path(__file__).resolve().parent

# (file name, type, byte offsets of the f16 scale fields, the first being `d`, blocks)
TYPES = [
    ("q5_0", T.Q5_0, [0], 4),
    ("q5_1", T.Q5_1, [0, 2], 4),
    ("q2_k", T.Q2_K, [80, 82], 3),
    ("q3_k", T.Q3_K, [108], 3),
    ("q5_k", T.Q5_K, [0, 2], 3),
    ("iq4_nl", T.IQ4_NL, [0], 4),
    ("iq4_xs", T.IQ4_XS, [0], 3),
    # NVFP4's scales are unsigned E4M3 bytes, finite for every byte: left random.
    ("nvfp4", T.NVFP4, [], 4),
]


def f16_bytes(x: float) -> bytes:
    return np.array([x], dtype=np.float16).tobytes()


def main() -> None:
    for i, (name, qtype, scale_offsets, n_blocks) in enumerate(TYPES):
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        rng = np.random.default_rng(0x5EED_0000 + i)
        data = bytearray(rng.integers(0, 256, size=n_blocks * type_size, dtype=np.uint8).tobytes())
        for b in range(n_blocks):
            for k, off in enumerate(scale_offsets):
                sign = -1.0 if rng.integers(0, 2) else 1.0
                value = sign * 2.0 ** rng.uniform(-14.0, 2.0)
                raw = f16_bytes(value)
                if b == n_blocks - 1 and k == 0:
                    # An f16 subnormal d: exercises the exact f16 -> f32 conversion.
                    raw = int(rng.integers(1, 0x400)).to_bytes(2, "little")
                data[b * type_size + off : b * type_size + off + 2] = raw
        blocks = np.frombuffer(bytes(data), dtype=np.uint8)
        values = quants.dequantize(blocks, qtype)
        assert values.dtype == np.float32 and values.size == n_blocks * block_size
        assert np.all(np.isfinite(values)), name
        bits = values.view(np.uint32)
        lines = [f"# {qtype.name} (ggml type {int(qtype)}): {n_blocks} blocks, from gguf.quants.dequantize; see generate.py"]
        for b in range(n_blocks):
            lines.append("block " + bytes(data[b * type_size : (b + 1) * type_size]).hex())
            lines.append("f32 " + " ".join(f"{v:08x}" for v in bits[b * block_size : (b + 1) * block_size]))
        (HERE / f"{name}.txt").write_text("\n".join(lines) + "\n")
        print(name, n_blocks, "blocks")


if __name__ == "__main__":
    main()
