#!/usr/bin/env python3
"""Reference vectors for qdrift-codecs' FP4 activation roundings (src/dynamic.rs: activations
`mxfp4` and `nvfp4`, `ActivationQuant::round_host_global`, `nvfp4_global_scale`), made by
compressed-tensors itself. Test-only; run by hand, not by the build:

    python3 -m venv /tmp/fp4venv && /tmp/fp4venv/bin/pip install torch compressed-tensors==0.20.1 \\
        torchao==0.18.0
    /tmp/fp4venv/bin/python crates/codecs/tests/fp4_act_py/generate.py

(torch 2.15.0 CPU, compressed-tensors 0.20.1, torchao 0.18.0.) Each activation matrix `[tokens, 64]` (float32) is
rounded as a `Linear` layer's input by compressed-tensors' own forward hook,
`quantization/lifecycle/forward.py` `forward_quantize(module, x, "input", args)` with the input
activation arguments of the presets `MXFP4` (group 32, E8M0 scales, dynamic) and `NVFP4`
(`tensor_group` 16, E4M3 scales, dynamic local scales under the static `input_global_scale`):
`quantization/utils/helpers.py` `compute_dynamic_scales_and_zp` and `calculate_qparams`
(`mxfp_utils.py` `generate_mx_scales` for MXFP4), then `fake_quantize`. The global scales are
`generate_gparam` of a calibration amax (448*6/amax), or none (a module without
`input_global_scale`). `mxfp4-ocp` is torchao 0.18.0's `prototype/mx_formats/mx_tensor.py`
`to_mx(x, float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)` (the OCP MX v1.0 §6.3 scale rule)
then `to_dtype(…, float32)`. It writes `vectors.txt` beside this script:

    matrix <tokens> <cols> <the f32 values, 8 hex digits of their bits each>
    mxfp4 <the rounded f32 values>
    mxfp4-ocp <the rounded f32 values>
    nvfp4 <global scale bits, or none> <the rounded f32 values>
    gparam <calibration amax bits> <generate_gparam's global scale bits>

The matrices (numpy seed 58): values of widely varying magnitude; blocks planted with E2M1 ties
at scale 1 (amax 6), an all-zero block, blocks whose amax mantissa is at or just below 1.75 (the
MX scale rounding's threshold), blocks tiny enough that NVFP4's E4M3 block scale is subnormal or
rounds to zero, and a global scale small or large enough that block scales saturate at 448.
"""

from pathlib import Path

import numpy as np
import torch
from compressed_tensors.quantization import QuantizationStatus, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import forward_quantize
from compressed_tensors.quantization.utils.helpers import generate_gparam
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

HERE = Path(__file__).resolve().parent
COLS = 64


def hexbits(a):
    return " ".join(f"{v:08x}" for v in np.asarray(a, np.float32).reshape(-1).view(np.uint32))


def rounded(x, preset, global_scale):
    """compressed-tensors' fake quantization of `x` as the input of a quantized Linear layer."""
    args = preset_name_to_scheme(preset, ["Linear"]).input_activations
    module = torch.nn.Linear(COLS, 4)
    module.quantization_status = QuantizationStatus.FROZEN
    if global_scale is not None:
        module.input_global_scale = torch.nn.Parameter(torch.tensor([global_scale], dtype=torch.float32),
                                                       requires_grad=False)
    with torch.no_grad():
        return forward_quantize(module, torch.from_numpy(x.copy()), "input", args).numpy()


def ocp(x):
    """torchao's MXFP4 with the OCP spec's scale rule, quantized and dequantized."""
    t = torch.from_numpy(x.copy())
    scale, data = to_mx(t, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    return to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, torch.float32).numpy()


def matrices(rng):
    out = []
    # 1. Widely varying magnitudes (2^-14 .. 2^6).
    a = (rng.random((6, COLS)) - 0.5) * np.exp2(rng.integers(-14, 7, (6, COLS)))
    out.append(a.astype(np.float32))
    # 2. Planted cases, one token each.
    ties = [6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0]
    t = np.zeros((6, COLS), np.float32)
    t[0, :16] = ties                        # E2M1 ties at scale 1 (NVFP4 without global, MX amax 6)
    t[0, 16:32] = np.array(ties) * 2.0      # the same at scale 2
    t[0, 32:48] = 0.0                       # an all-zero block of 16 (and of 32 with the next one)
    t[0, 48:64] = 0.0
    t[1, :32] = np.linspace(-1.75, 1.75, 32)          # MX amax mantissa exactly 1.75
    t[1, 32:64] = np.linspace(-1.7499999, 1.7, 32)    # just below 1.75: saturates under `floor`
    t[2, :32] = rng.standard_normal(32) * 1e-5        # small blocks
    t[2, 32:48] = rng.standard_normal(16) * 1e-9      # NVFP4 block scale rounds to an E4M3 subnormal
    t[2, 48:64] = rng.standard_normal(16) * 1e-30     # ... or to zero
    t[3] = rng.standard_normal(COLS) * 300.0          # large values (saturating block scales)
    t[4, :32] = 7.0 * np.sign(rng.standard_normal(32))    # MX: 7 = 1.75*4, next scale
    t[4, 32:] = rng.standard_normal(32) * 3.0
    t[5] = np.float32(1.0) + np.arange(COLS, dtype=np.float32) / 16.0
    out.append(t)
    return out


def main():
    rng = np.random.default_rng(58)
    lines = ["# FP4 activation rounding by compressed-tensors 0.20.1; see generate.py"]
    for x in matrices(rng):
        lines.append(f"matrix {x.shape[0]} {x.shape[1]} {hexbits(x)}")
        lines.append(f"mxfp4 {hexbits(rounded(x, 'MXFP4', None))}")
        lines.append(f"mxfp4-ocp {hexbits(ocp(x))}")
        amax = float(np.abs(x).max())
        gs = [None, 1.0, float(generate_gparam(torch.tensor(-amax), torch.tensor(amax))[0]),
              float(generate_gparam(torch.tensor(-amax / 50.0), torch.tensor(amax / 50.0))[0]),
              float(generate_gparam(torch.tensor(-amax * 1e4), torch.tensor(amax * 1e4))[0])]
        for g in gs:
            tag = "none" if g is None else hexbits([g])
            lines.append(f"nvfp4 {tag} {hexbits(rounded(x, 'NVFP4', g))}")
    for amax in [1.0, 2688.0, 0.0123, 3.0e-5, 7.5e4, 0.0, 1e-40, 3.3e38]:
        a = torch.tensor(amax, dtype=torch.float32)
        g = generate_gparam(-a, a)
        lines.append(f"gparam {hexbits([a.item()])} {hexbits(g.numpy())}")
    (HERE / "vectors.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
