#!/usr/bin/env python3
"""Reference vectors for qdrift-codecs' FP4 weight schemes (`formats/nvfp4.rs`, `formats/mxfp4.rs`),
made by the reference libraries themselves. Test-only; run by hand, not by the build:

    python3 -m venv /tmp/fp4venv && /tmp/fp4venv/bin/pip install torch compressed-tensors==0.20.1 \\
        ml_dtypes && /tmp/fp4venv/bin/pip install --no-deps torchao==0.18.0
    /tmp/fp4venv/bin/python crates/codecs/tests/fp4_ref/generate.py

(torch 2.15.0 run on the CPU, compressed-tensors 0.20.1, torchao 0.18.0.) For seeded float32 matrices
`[rows, 64]` it writes `vectors.txt` beside this script, one record per matrix and scheme:

    matrix <rows> <cols> <the f32 values, 8 hex digits of their bits each>
    nvfp4 <global scale bits> <E4M3 scale codes, hex bytes> <dequantized f32 bits>
    mxfp4-ct <E8M0 scale codes, hex bytes> <dequantized f32 bits>
    mxfp4-ocp <E8M0 scale codes, hex bytes> <dequantized f32 bits>   (or `mxfp4-ocp -`)

- nvfp4: compressed-tensors preset `NVFP4A16` (`tensor_group`, group 16):
  `quantization/utils/helpers.py` `generate_gparam` and `calculate_qparams`, then
  `quantization/lifecycle/forward.py` `fake_quantize` (quantize then dequantize: `scale /
  global_scale`, `x / scale` clamped to ±6 and rounded by `cast_to_fp4`, times the scale). The
  global scale is `weight_global_scale` (448*6/amax).
- mxfp4-ct: compressed-tensors preset `MXFP4A16` (group 32, E8M0 scales): `calculate_qparams`
  (`generate_mx_scales`: `round_to_power_2` of the block's amax, then `floor(log2) - 2`) and
  `fake_quantize`; the codes are `compressors/mx_utils.py` `compress_mx_scale`. Cross-checked
  here against torchao `to_mx(..., ScaleCalculationMode.EVEN)`, the same rule.
- mxfp4-ocp: torchao `prototype/mx_formats/mx_tensor.py` `to_mx(..., ScaleCalculationMode.FLOOR)`
  (the OCP MX v1.0 §6.3 rule: X = 2^(floor(log2(amax)) - 2), elements rounded to nearest even and
  saturated at ±6) and `to_dtype` (dequantize). Left out (`-`) for the matrix of tiny values:
  torchao divides by 2^-126 where the E8M0 code is 0 (2^-127), a known deviation of its own
  (see its comment on subnormal scales in `to_mx`).
"""

from pathlib import Path

import numpy as np
import torch
from compressed_tensors.compressors.mx_utils import compress_mx_scale
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_dtype, to_mx

HERE = Path(__file__).resolve().parent


def hexbits(a):
    return " ".join(f"{v:08x}" for v in np.asarray(a, np.float32).reshape(-1).view(np.uint32))


def nvfp4(W):
    args = preset_name_to_scheme("NVFP4A16", ["Linear"]).weights
    rows, cols = W.shape
    gs = generate_gparam(W.min(), W.max())
    Wg = W.reshape(rows, cols // 16, 16)
    scale, zp = calculate_qparams(Wg.amin(-1), Wg.amax(-1), args, global_scale=gs)
    d = fake_quantize(x=W.clone(), scale=scale, zero_point=zp, args=args, global_scale=gs)
    codes = scale.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1).numpy().tobytes().hex()
    return f"nvfp4 {hexbits(gs.numpy())} {codes} {hexbits(d.numpy())}", d


def mxfp4_ct(W):
    args = preset_name_to_scheme("MXFP4A16", ["Linear"]).weights
    rows, cols = W.shape
    Wg = W.reshape(rows, cols // 32, 32)
    scale, zp = calculate_qparams(Wg.amin(-1), Wg.amax(-1), args)
    d = fake_quantize(x=W.clone(), scale=scale, zero_point=zp, args=args)
    e = compress_mx_scale(scale, torch.uint8).reshape(-1)
    # The same rule in torchao (EVEN mode), as a cross-check.
    s_even, _ = to_mx(W.clone(), torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.EVEN)
    assert torch.equal(s_even.view(torch.uint8).reshape(-1), e), "compressed-tensors vs torchao EVEN"
    return f"mxfp4-ct {e.numpy().tobytes().hex()} {hexbits(d.numpy())}", d


def mxfp4_ocp(W):
    s, data = to_mx(W.clone(), torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    d = to_dtype(data, s, torch.float4_e2m1fn_x2, 32, torch.float32)
    return f"mxfp4-ocp {s.view(torch.uint8).reshape(-1).numpy().tobytes().hex()} {hexbits(d.numpy())}", d


def main():
    rng = np.random.default_rng(0x4650)
    mats = [
        (rng.standard_normal((4, 64)) * 0.05).astype(np.float32),
        # Rows of very different magnitude: the small rows' NVFP4 block scales are E4M3
        # subnormals (below 2^-6) under the large rows' global scale.
        (rng.standard_normal((4, 64)) * np.array([[10.0], [1e-3], [3e-4], [0.2]])).astype(np.float32),
    ]
    z = (rng.standard_normal((4, 64)) * 0.2).astype(np.float32)
    z[0, :32] = 0.0  # an all-zero NVFP4 and MXFP4 block
    z[0, 40] = -0.0
    # E2M1 ties once scaled (MXFP4 scale 1: block amax 6), and amaxes just above and below
    # the points where the MXFP4 rules part (1.75 and 1.5 times a power of two).
    z[1, :] = np.tile(np.array([6, 5, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, -6, -5, -3.5, -2.5, -1.75, -1.25, -0.75,
                                -0.25], np.float32), 4)
    z[2, :32] = np.linspace(-7.5, 7.0, 32, dtype=np.float32)  # amax 7.5: OCP saturates, ct rounds up
    z[2, 32:] = np.linspace(-3.4, 3.4, 32, dtype=np.float32)
    z[3, :32] *= np.float32(1.7 / np.abs(z[3, :32]).max())
    z[3, 32:] *= np.float32(1.75 / np.abs(z[3, 32:]).max())
    mats.append(z)
    # The same ties in a tensor of amax 6, so that NVFP4's global scale is 448 and the block
    # scale 1 too.
    t = (rng.standard_normal((2, 64)) * 0.5).astype(np.float32)
    t[0, :] = z[1, :]
    mats.append(t)
    # Heavy-tailed rows over many binades (scales across the E4M3 and E8M0 ranges).
    for _ in range(4):
        m = rng.standard_t(3, (4, 64)) * np.exp2(rng.integers(-12, 6, (4, 1)))
        mats.append(m.astype(np.float32))
    tiny = (rng.standard_normal((2, 64)) * 1e-3).astype(np.float32)
    tiny[0, :32] = (rng.standard_normal(32) * 1e-39).astype(np.float32)  # E8M0 code 0 under ct
    mats.append(tiny)
    lines = ["# FP4 weight-scheme reference quantize-dequantize vectors; see generate.py"]
    for k, W in enumerate(mats):
        rows, cols = W.shape
        lines.append(f"matrix {rows} {cols} {hexbits(W)}")
        t = torch.from_numpy(W)
        line, _ = nvfp4(t)
        lines.append(line)
        line, _ = mxfp4_ct(t)
        lines.append(line)
        if k == len(mats) - 1:
            lines.append("mxfp4-ocp -")
        else:
            line, _ = mxfp4_ocp(t)
            lines.append(line)
    (HERE / "vectors.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(mats)} matrices, {sum(m.size for m in mats)} values")


if __name__ == "__main__":
    main()
