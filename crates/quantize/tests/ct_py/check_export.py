#!/usr/bin/env python3
"""compressed-tensors' own reading of the FP4 folders `qdrift quantize --packed` writes
(`write_compressed_tensors`; test-only, run by hand).

The Rust test `tests/ct_export.rs` writes, with `QDRIFT_CT_EXPORT=DIR`, one compressed-tensors
folder per FP4 scheme (`DIR/nvfp4`, `DIR/mxfp4-ct`, `DIR/mxfp4-ocp`) and the same scheme's
dequantized weights as qdrift writes them (`DIR/<scheme>.safetensors`, F32, same names). This
script parses each folder's `quantization_config` with compressed-tensors
(`QuantizationConfig`), takes the compressor its `format` names from the registry
(`BaseCompressor.load_from_registry`: `NVFP4PackedCompressor`, `MXFP4PackedCompressor`) and
decompresses every quantized linear layer with it, as `transformers` and vLLM's loaders do
(their `weight` comes back in bfloat16: compared with qdrift's values rounded to bfloat16). It
also dequantizes in float32 (`unpack_fp4_from_uint8(..., dtype=float32)`, then
`quantization/lifecycle/forward.py` `dequantize`, MXFP4 scales through
`compressors/mx_utils.py` `decompress_mx_scale`), which must equal qdrift's values bit for bit.

    python3 -m venv /tmp/fp4venv && /tmp/fp4venv/bin/pip install torch compressed-tensors==0.20.1 \\
        safetensors numpy
    QDRIFT_CT_EXPORT=/tmp/ctexp cargo test --release --workspace --test ct_export
    /tmp/fp4venv/bin/python crates/quantize/tests/ct_py/check_export.py /tmp/ctexp \\
        > crates/quantize/tests/ct_py/check_export.txt

`check_export.txt` beside this script is the output of the last run.
"""

import json
import sys
from pathlib import Path

import compressed_tensors
import numpy as np
import torch
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.compressors.mx_utils import decompress_mx_scale
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import load_file


def check(folder: Path, expected_file: Path) -> str:
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    qc = QuantizationConfig.model_validate(config)
    (scheme,) = qc.config_groups.values()
    compressor = BaseCompressor.load_from_registry(qc.format)
    tensors = load_file(folder / "model.safetensors")
    expected = load_file(expected_file)
    modules = sorted(n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed"))
    params = compressor.compression_param_names(scheme)
    bf16_equal = f32_equal = 0
    for m in modules:
        state = {p: tensors[f"{m}.{p}"] for p in params if f"{m}.{p}" in tensors}
        want = expected[f"{m}.weight"]
        got = compressor.decompress(state, scheme)["weight"]
        bf16_equal += torch.equal(got.view(torch.int16), want.to(got.dtype).view(torch.int16))
        packed = state["weight_packed"]
        q = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
        scale = state["weight_scale"]
        scale = decompress_mx_scale(scale).to(torch.float32) if scale.dtype == torch.uint8 else scale.to(torch.float32)
        f32 = dequantize(x_q=q, scale=scale, args=scheme.weights, global_scale=state.get("weight_global_scale"),
                         dtype=torch.float32)
        f32_equal += torch.equal(f32.view(torch.int32), want.view(torch.int32))
    others = [n for n in tensors if n in expected and not any(n.startswith(m + ".") for m in modules)]
    same = sum(torch.equal(tensors[n].view(torch.int32), expected[n].view(torch.int32)) for n in others)
    n = len(modules)
    w = scheme.weights
    return (f"{folder.name:<10} {qc.format}, strategy {w.strategy}, group_size {w.group_size}, {type(compressor).__name__}: "
            f"{n} linear layers, {bf16_equal}/{n} decompressed (bfloat16) equal, {f32_equal}/{n} float32 "
            f"bit-equal to qdrift's dequantized weights; {same}/{len(others)} other tensors bit-equal")


def main():
    root = Path(sys.argv[1])
    print(f"compressed-tensors {compressed_tensors.__version__}, torch {torch.__version__}, numpy {np.__version__}")
    for scheme in ["nvfp4", "mxfp4-ct", "mxfp4-ocp"]:
        print(check(root / scheme, root / f"{scheme}.safetensors"))


if __name__ == "__main__":
    main()
