#!/usr/bin/env python3
"""Reference vectors for qdrift-ggml's `nvfp4_quantize` (src/nvfp4_tensor.rs), made by the
reference libraries themselves. Test-only; run by hand, not by the build:

    python3 -m venv /tmp/fp4venv && /tmp/fp4venv/bin/pip install torch compressed-tensors==0.20.1 \\
        nvidia-modelopt==0.47.0
    /tmp/fp4venv/bin/python crates/ggml/tests/nvfp4_ref/generate.py

(torch 2.15.0 CPU, compressed-tensors 0.20.1, nvidia-modelopt 0.47.0.) For a few seeded float32
matrices `[rows, 64]` (one with an all-zero row and block, one with values at E2M1 ties after
scaling) it writes `vectors.txt` beside this script, one record per matrix and tool:

    matrix <rows> <cols> <the f32 values, 8 hex digits of their bits each>
    ct <global scale bits> <E4M3 scale codes, hex bytes> <E2M1 codes, one hex digit each>
    modelopt <global scale bits> <E4M3 scale codes> <E2M1 codes>

- ct: compressed-tensors `quantization/utils/helpers.py` `generate_gparam` and
  `calculate_qparams` (preset `NVFP4A16`), then `quantization/lifecycle/forward.py` `quantize`
  (the codes via `compressors/nvfp4/helpers.py` `pack_fp4_to_uint8`, unpacked nibble by nibble).
  The global scale is `weight_global_scale` (448*6/amax).
- modelopt: `modelopt/torch/quantization/qtensor/nvfp4_tensor.py` `NVFP4QTensor.quantize(x, 16)`
  (codes unpacked from its packed bytes). The global scale is `weight_scale_2` (amax/(6*448)).
"""

from pathlib import Path

import numpy as np
import torch
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

HERE = Path(__file__).resolve().parent


def hexbits(a):
    return " ".join(f"{v:08x}" for v in np.asarray(a, np.float32).reshape(-1).view(np.uint32))


def codes_of(packed):
    p = packed.reshape(-1).numpy()
    return "".join(f"{lo:x}{hi:x}" for lo, hi in zip(p & 0xF, p >> 4))


def scales_of(s):
    return s.reshape(-1).view(torch.uint8).numpy().tobytes().hex()


def ct(W):
    args = preset_name_to_scheme("NVFP4A16", ["Linear"]).weights
    rows, cols = W.shape
    gs = generate_gparam(W.min(), W.max())
    Wg = W.reshape(rows, cols // 16, 16)
    scale, zp = calculate_qparams(Wg.amin(-1), Wg.amax(-1), args, global_scale=gs)
    q = quantize(x=W, scale=scale, zero_point=zp, args=args, global_scale=gs)
    return f"ct {hexbits(gs.numpy())} {scales_of(scale.to(torch.float8_e4m3fn))} {codes_of(pack_fp4_to_uint8(q))}"


def modelopt(W):
    q, scale, scale_2 = NVFP4QTensor.quantize(W.clone(), 16)
    return f"modelopt {hexbits(scale_2.numpy())} {scales_of(scale)} {codes_of(q._quantized_data)}"


def main():
    rng = np.random.default_rng(0x4E56)
    mats = [
        (rng.standard_normal((4, 64)) * 0.05).astype(np.float32),
        (rng.standard_normal((3, 64)) * rng.uniform(1e-3, 10.0, (3, 1))).astype(np.float32),
    ]
    z = (rng.standard_normal((2, 64)) * 0.2).astype(np.float32)
    z[0, :16] = 0.0   # an all-zero block
    z[1, :] = np.tile(np.array([6, 5, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, -6, -5, -3.5, -2.5, -1.75, -1.25, -0.75, -0.25],
                               np.float32), 4)  # E2M1 ties once the block's scale is 1
    mats.append(z)
    lines = ["# NVFP4 reference quantizations; see generate.py"]
    for W in mats:
        rows, cols = W.shape
        lines.append(f"matrix {rows} {cols} {hexbits(W)}")
        t = torch.from_numpy(W)
        lines.append(ct(t))
        lines.append(modelopt(t))
    (HERE / "vectors.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
