#!/usr/bin/env python3
"""FP4 fixtures for qdrift's reader of quantized Hugging Face folders (crates/load/src/hf/quant/fp4.rs
and modelopt.rs), made by the reference libraries themselves.

Same tiny Llama as generate.py (its `weights` and `write_folder`; intermediate size 96, so every
row is whole groups of 16 and 32), each linear layer quantized and packed by:

- ct_nvfp4: compressed-tensors 0.20.1, preset `NVFP4A16` (`tensor_group`, group 16, FP8 E4M3
  scales): `quantization/utils/helpers.py` `generate_gparam` (global scale 448*6/amax) and
  `calculate_qparams`, then `compressors/nvfp4/base.py` `NVFP4PackedCompressor.compress`
  (`weight_packed`, `weight_scale`, `weight_global_scale`).
- ct_mxfp4: compressed-tensors 0.20.1, preset `MXFP4A16` (group 32, E8M0 scales):
  `calculate_qparams`, then `compressors/mxfp4/base.py` `MXFP4PackedCompressor.compress`.
- modelopt_nvfp4: nvidia-modelopt 0.47.0, `W4A16_NVFP4` export layout:
  `modelopt/torch/quantization/qtensor/nvfp4_tensor.py` `NVFP4QTensor.quantize(w, 16)`
  (`weight` packed U8, `weight_scale` FP8 E4M3, `weight_scale_2` = amax/(6*448), a 0-d F32), with
  `hf_quant_config.json` and config.json's `quantization_config` from
  `modelopt/torch/export/convert_hf_config.py` `convert_hf_quant_config_format`.

`expected.safetensors` is each library's own dequantization in float32: compressed-tensors
`unpack_fp4_from_uint8(..., dtype=float32)` and `quantization/lifecycle/forward.py` `dequantize`
(`scale / global_scale`, then `q * scale`; MXFP4 scales through `compressors/mx_utils.py`
`decompress_mx_scale`), ModelOpt `NVFP4QTensor.dequantize(dtype=float32, ...)`
(`q * (scale * scale_2)`). The libraries then cast to the model's dtype; qdrift keeps float32.

Run in a venv with torch 2.x, compressed-tensors==0.20.1, nvidia-modelopt==0.47.0, numpy and
safetensors:
    python3 generate_fp4.py
The output is deterministic (numpy seed 58).
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import HERE, weights, write_folder  # noqa: E402

from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.mx_utils import decompress_mx_scale  # noqa: E402
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402
from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format  # noqa: E402
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor  # noqa: E402

INTER = 96


def ct_config(fmt, preset):
    """The `quantization_config` compressed-tensors writes for one `Linear` group of `preset`."""
    w = preset_name_to_scheme(preset, ["Linear"]).weights
    return {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": w.num_bits, "type": w.type, "symmetric": w.symmetric,
                        "group_size": w.group_size, "strategy": w.strategy, "dynamic": False,
                        "scale_dtype": str(w.scale_dtype)}}},
    }


def numpy_of(t):
    """A torch tensor as numpy (float8 as its ml_dtypes type, via its bytes)."""
    if t.dtype == torch.float8_e4m3fn:
        import ml_dtypes
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def ct_folder(name, fmt, preset, compressor, group, rng):
    scheme = preset_name_to_scheme(preset, ["Linear"])
    tensors, expected = {}, {}
    for n, W in weights(rng, INTER).items():
        W = torch.from_numpy(W)
        out, inp = W.shape
        gs = generate_gparam(W.min(), W.max()) if fmt.startswith("nvfp4") else None
        Wg = W.reshape(out, inp // group, group)
        scale, zp = calculate_qparams(Wg.amin(-1), Wg.amax(-1), scheme.weights, global_scale=gs)
        sd = {"weight": W, "weight_scale": scale, "weight_zero_point": zp}
        if gs is not None:
            sd["weight_global_scale"] = gs
        c = compressor.compress(sd, scheme)
        p = f"model.layers.0.{n}"
        for k, v in c.items():
            tensors[f"{p}.{k}"] = numpy_of(v)
        q = unpack_fp4_from_uint8(c["weight_packed"], out, inp, dtype=torch.float32)
        s = c["weight_scale"]
        s = decompress_mx_scale(s).to(torch.float32) if gs is None else s.to(torch.float32)
        expected[n] = dequantize(x_q=q, scale=s, args=scheme.weights, global_scale=gs,
                                 dtype=torch.float32).numpy()
    write_folder(name, INTER, ct_config(fmt, preset), tensors, expected, rng)


def modelopt_folder(rng):
    hf_quant_config = {"producer": {"name": "modelopt", "version": "0.47.0"},
                       "quantization": {"quant_algo": "W4A16_NVFP4", "group_size": 16,
                                        "exclude_modules": ["lm_head"], "kv_cache_quant_algo": None}}
    tensors, expected = {}, {}
    for n, W in weights(rng, INTER).items():
        q, scale, scale_2 = NVFP4QTensor.quantize(torch.from_numpy(W), 16)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.weight"] = q._quantized_data.numpy()
        tensors[f"{p}.weight_scale"] = numpy_of(scale)
        tensors[f"{p}.weight_scale_2"] = scale_2.reshape([]).numpy()
        expected[n] = q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2,
                                   block_sizes={-1: 16}).numpy()
    write_folder("modelopt_nvfp4", INTER, convert_hf_quant_config_format(hf_quant_config), tensors,
                 expected, rng)
    with open(os.path.join(HERE, "modelopt_nvfp4", "hf_quant_config.json"), "w") as f:
        json.dump(hf_quant_config, f, indent=4)


def main():
    rng = np.random.default_rng(58)
    ct_folder("ct_nvfp4", "nvfp4-pack-quantized", "NVFP4A16", NVFP4PackedCompressor, 16, rng)
    ct_folder("ct_mxfp4", "mxfp4-pack-quantized", "MXFP4A16", MXFP4PackedCompressor, 32, rng)
    modelopt_folder(rng)


if __name__ == "__main__":
    main()
