#!/usr/bin/env python3
"""Independent fixtures for qdrift's reader of quantized Hugging Face folders (crates/load/src/hf/quant/).

Each folder under this directory is a tiny Llama checkpoint (1 layer, hidden 64, 4 heads, 2 KV
heads, vocab 16: AutoGPTQ's and AutoAWQ's packers need dimensions that are multiples of 32)
whose linear layers are quantized and packed by numpy transliterations of the reference
libraries' own packing functions, with `expected.safetensors` holding every linear
layer dequantized by a transliteration of the same library's dequantization (float32, `[out, in]`,
Hugging Face row order). `crates/load/tests/hf_quant_vectors.rs` reads each folder with
`open_model` and compares bit for bit.

The libraries themselves need PyTorch (and GPU kernels for AutoAWQ/GPTQModel); their pure
packing functions are transliterated line by line instead, each citing its file and function:

- gptq_v1_4bit_desc_act: AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`
  `QuantLinear.pack` (v1: `zeros -= 1` before packing) and its `forward` fallback
  dequantization (`zeros = zeros + 1; zeros = bitwise_and(zeros, 2**bits - 1)`), with act-order
  `g_idx` (`desc_act: true`), symmetric, group 16.
- gptq_v2_8bit_asym: GPTQModel `gptqmodel/nn_modules/qlinear/__init__.py`
  `PackableQuantLinear.pack` (v2 keeps `zeros`) and `dequantize_weight`, 8 bits, asymmetric,
  group 16.
- awq_gemm: AutoAWQ `awq/modules/linear/gemm.py` `WQLinear_GEMM.from_linear` (order map
  `[0, 2, 4, 6, 1, 3, 5, 7]`) and `awq/utils/packing_utils.py` `dequantize_gemm`
  (`unpack_awq`, `reverse_awq_order` with `AWQ_REVERSE_ORDER`), group 16.
- ct_pack_int4_asym: compressed-tensors `compressors/quantized_compressors/pack_quantized.py`
  `pack_to_int32` / `unpack_from_int32` (offset 2**(bits-1), padding to whole int32 words,
  zero points packed along dim 0), `quantization/utils/helpers.py` `calculate_qparams` and
  `quantization/lifecycle/forward.py` `_quantize` / `_dequantize`; int4 asymmetric, group 4,
  intermediate size 44 (the input of down_proj is padded in its last word).
- ct_fp8_channel: compressed-tensors `float_quantized.py`; FP8 E4M3 per channel with BF16
  scales and dynamic per-token FP8 input activations (llm-compressor's FP8_DYNAMIC scheme).
- fp8_block: `transformers` `integrations/finegrained_fp8.py` layout and DeepSeek-V3
  `inference/kernel.py` `weight_dequant` (`y = x.float() * s`), blocks of 16 x 16 (partial
  blocks at 44).

FP8 casts use ml_dtypes `float8_e4m3fn` (round to nearest even; OCP OFP8 E4M3).

Arithmetic: the libraries multiply `(q - z) * scale` in the scale's dtype (F16/BF16); the
expected values here are the exact products in float32, which is what qdrift computes (documented
in crates/load/src/hf/quant/). Every other step follows the cited code.

Run with numpy, ml_dtypes and safetensors installed:
    python3 generate.py
The output is deterministic (numpy seed 15).
"""

import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
HIDDEN, HEADS, KV_HEADS, VOCAB = 64, 4, 2, 16
HEAD_DIM = HIDDEN // HEADS
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def shapes(inter):
    kv = KV_HEADS * HEAD_DIM
    return {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (kv, HIDDEN),
            "self_attn.v_proj": (kv, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
            "mlp.gate_proj": (inter, HIDDEN), "mlp.up_proj": (inter, HIDDEN),
            "mlp.down_proj": (HIDDEN, inter)}


def weights(rng, inter):
    return {n: (rng.standard_normal(s) * 0.1).astype(np.float16).astype(np.float32)
            for n, s in shapes(inter).items()}


def write_folder(name, inter, quantization_config, tensors, expected, rng):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16",
        "quantization_config": quantization_config,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB):
        vocab[f"w{i}"] = i
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, indent=1)
    base = {
        "model.embed_tokens.weight": (rng.standard_normal((VOCAB, HIDDEN)) * 0.1).astype(np.float16),
        "model.layers.0.input_layernorm.weight": np.ones(HIDDEN, np.float16),
        "model.layers.0.post_attention_layernorm.weight": np.ones(HIDDEN, np.float16),
        "model.norm.weight": np.ones(HIDDEN, np.float16),
    }
    base.update(tensors)
    save_file(base, os.path.join(d, "model.safetensors"))
    save_file({f"model.layers.0.{n}.weight": np.ascontiguousarray(v.astype(np.float32))
               for n, v in expected.items()}, os.path.join(d, "expected.safetensors"))


# ---------------------------------------------------------------- GPTQ (AutoGPTQ / GPTQModel)

def gptq_qparams(w_cols, bits, sym):
    """GPTQ's `Quantizer.find_params` (auto_gptq/quantization/quantizer.py) per output row of
    one group: xmin = min(x.min, 0), xmax = max(x.max, 0); sym: xmax = max(|xmin|, xmax),
    xmin = -xmax; scale = (xmax - xmin) / maxq; zero = round(-xmin / scale) (sym: (maxq+1)/2)."""
    maxq = 2 ** bits - 1
    xmin = np.minimum(w_cols.min(axis=1), 0)
    xmax = np.maximum(w_cols.max(axis=1), 0)
    if sym:
        xmax = np.maximum(np.abs(xmin), xmax)
        xmin = np.where(xmin < 0, -xmax, xmin)
    tmp = (xmin == 0) & (xmax == 0)
    xmin[tmp], xmax[tmp] = -1, 1
    scale = (xmax - xmin) / maxq
    zero = np.full_like(scale, (maxq + 1) / 2) if sym else np.round(-xmin / scale)
    return scale.astype(np.float16), zero


def gptq_pack(W, bits, group, sym, g_idx, v1):
    """`QuantLinear.pack(linear, scales, zeros, g_idx)` of qlinear_cuda_old.py (GPTQModel's
    `PackableQuantLinear.pack` is the same without `zeros -= 1`). W: [out, in]."""
    out, infeatures = W.shape
    groups = infeatures // group
    scales = np.zeros((out, groups), np.float16)   # the quantizer's [out, groups], then .t()
    zeros = np.zeros((out, groups))
    for g in range(groups):
        cols = W[:, g_idx == g]
        scales[:, g], zeros[:, g] = gptq_qparams(cols, bits, sym)
    scales = scales.T.copy()                      # scales = scales.t().contiguous()
    zeros = zeros.T.copy()
    scale_zeros = zeros * scales.astype(np.float32)
    intweight = []
    for idx in range(infeatures):
        g = g_idx[idx]
        col = np.round((W[:, idx] + scale_zeros[g]) / scales[g].astype(np.float32))
        intweight.append(np.clip(col, 0, 2 ** bits - 1).astype(np.int64)[:, None])
    intweight = np.concatenate(intweight, axis=1).T.copy().astype(np.uint32)   # [in, out]
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + (32 // bits)):
            qweight[row] |= intweight[j] << (bits * (j - i))
        i += 32 // bits
        row += 1
    qweight = qweight.astype(np.int32)
    zeros = zeros.astype(np.int64)
    if v1:
        zeros -= 1
    zeros = zeros.astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * bits), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + (32 // bits)):
            qzeros[:, col] |= zeros[:, j] << (bits * (j - i))
        i += 32 // bits
        col += 1
    return qweight, qzeros.astype(np.int32), scales, g_idx.astype(np.int32)


def gptq_dequant(qweight, qzeros, scales, g_idx, bits, v1):
    """qlinear_cuda_old.py `forward` fallback (v1) / GPTQModel `dequantize_weight` (v2):
    returns [out, in]."""
    pf = 32 // bits
    wf = np.arange(0, 32, bits, dtype=np.uint32)
    z = (qzeros.astype(np.uint32)[:, :, None] >> wf[None, None, :]).astype(np.int64)
    if v1:
        z = z + 1
    z = (z & (2 ** bits - 1)).reshape(scales.shape)
    w = (qweight.astype(np.uint32)[:, None, :] >> wf[None, :, None]).astype(np.int64) & (2 ** bits - 1)
    w = w.reshape(w.shape[0] * pf, w.shape[2])          # [in, out]
    s = scales.astype(np.float32)
    deq = s[g_idx] * (w - z[g_idx]).astype(np.float32)    # exact in float32
    return deq.T


def gptq_folder(name, rng, bits, group, sym, desc_act, v1):
    inter = 64
    ws = weights(rng, inter)
    tensors, expected = {}, {}
    for n, W in ws.items():
        infeatures = W.shape[1]
        g_idx = np.arange(infeatures) // group
        if desc_act:
            # act order: columns quantized in a permuted order, g_idx records each column's group
            perm = rng.permutation(infeatures)
            g_idx = np.empty(infeatures, np.int64)
            g_idx[perm] = np.arange(infeatures) // group
        qweight, qzeros, scales, gi = gptq_pack(W, bits, group, sym, g_idx, v1)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.qweight"], tensors[f"{p}.qzeros"] = qweight, qzeros
        tensors[f"{p}.scales"], tensors[f"{p}.g_idx"] = scales, gi
        expected[n] = gptq_dequant(qweight, qzeros, scales, gi, bits, v1)
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act,
              "sym": sym, "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    write_folder(name, inter, config, tensors, expected, rng)


# ---------------------------------------------------------------- AWQ (AutoAWQ GEMM)

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_pack(W, group):
    """`WQLinear_GEMM.from_linear(linear, w_bit=4, group_size, scales, zeros)` of gemm.py, with
    scales/zeros from AutoAWQ's `pseudo_quantize_tensor` (zero_point=True):
    max_int = 15, scales = (max - min) / max_int, zeros = -round(min / scales)."""
    out, infeatures = W.shape
    g = W.reshape(out, infeatures // group, group)
    mx, mn = g.max(axis=2), g.min(axis=2)
    scales = ((mx - mn).clip(min=1e-5) / 15).astype(np.float16)
    zeros = np.clip(-np.round(mn / scales.astype(np.float32)), 0, 15)
    scales, zeros = scales.T.copy(), zeros.T.copy()   # [groups, out]
    scale_zeros = zeros * scales.astype(np.float32)
    intweight = []
    for idx in range(infeatures):
        col = np.round((W[:, idx] + scale_zeros[idx // group]) / scales[idx // group].astype(np.float32))
        intweight.append(np.clip(col, 0, 15).astype(np.int64)[:, None])
    intweight = np.concatenate(intweight, axis=1).T.copy().astype(np.int64)   # [in, out]
    pack_num = 8
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // 32 * 4), dtype=np.int64)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + AWQ_ORDER[i]] << (i * 4)
    zeros = zeros.astype(np.int64)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * 4), dtype=np.int64)
    for col in range(zeros.shape[1] // pack_num):
        for i in range(pack_num):
            qzeros[:, col] |= zeros[:, col * pack_num + AWQ_ORDER[i]] << (i * 4)
    wrap = lambda a: a.astype(np.uint32).astype(np.int32)
    return wrap(qweight), wrap(qzeros), scales


def awq_dequant(qweight, qzeros, scales, group):
    """packing_utils.py `dequantize_gemm`: unpack_awq, reverse_awq_order, (iw - iz) * scales.
    Returns [out, in]."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    iw = (qweight.astype(np.uint32)[:, :, None] >> shifts[None, None, :]).reshape(qweight.shape[0], -1)
    iz = (qzeros.astype(np.uint32)[:, :, None] >> shifts[None, None, :]).reshape(qzeros.shape[0], -1)
    order = np.arange(iw.shape[-1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
    iw, iz = iw[:, order] & 15, iz[:, order] & 15
    s = np.repeat(scales.astype(np.float32), group, axis=0)
    iz = np.repeat(iz, group, axis=0)
    return ((iw.astype(np.int64) - iz.astype(np.int64)).astype(np.float32) * s).T


def awq_folder(rng):
    group, inter = 16, 64
    tensors, expected = {}, {}
    for n, W in weights(rng, inter).items():
        qweight, qzeros, scales = awq_pack(W, group)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.qweight"], tensors[f"{p}.qzeros"], tensors[f"{p}.scales"] = qweight, qzeros, scales
        expected[n] = awq_dequant(qweight, qzeros, scales, group)
    config = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": group, "zero_point": True}
    write_folder("awq_gemm", inter, config, tensors, expected, rng)


# ---------------------------------------------------------------- compressed-tensors

def pack_to_int32(value, num_bits, packed_dim=1):
    """pack_quantized.py `pack_to_int32`: unsigned by + 2**(bits-1), pad to whole words,
    element i of a word at bits * i."""
    offset = 1 << (num_bits - 1)
    value = (value + offset).astype(np.uint8).astype(np.uint32)
    if packed_dim == 0:
        value = value.T
    pack_factor = 32 // num_bits
    rows, cols = value.shape
    padded = -(-cols // pack_factor) * pack_factor
    value = np.pad(value, ((0, 0), (0, padded - cols)))
    packed = np.zeros((rows, padded // pack_factor), np.uint32)
    for i in range(pack_factor):
        packed |= value[:, i::pack_factor] << (num_bits * i)
    packed = packed.astype(np.int32)
    return packed.T.copy() if packed_dim == 0 else packed


def unpack_from_int32(packed, num_bits, shape, packed_dim=1):
    """pack_quantized.py `unpack_from_int32`."""
    if packed_dim == 0:
        packed = packed.T
    pack_factor = 32 // num_bits
    mask = (1 << num_bits) - 1
    p = packed.astype(np.uint32)
    cols = np.stack([(p >> (num_bits * i)) & mask for i in range(pack_factor)], axis=2)
    cols = cols.reshape(p.shape[0], -1).astype(np.int64)
    rows_wanted, cols_wanted = (shape[1], shape[0]) if packed_dim == 0 else shape
    out = cols[:rows_wanted, :cols_wanted] - (1 << (num_bits - 1))
    return out.T if packed_dim == 0 else out


def ct_qparams(x_groups, bits, symmetric):
    """helpers.py `calculate_qparams`: min/max widened to 0; symmetric scale =
    max(|min|, |max|) / ((q_max - q_min) / 2), zero 0; asymmetric scale = (max - min) /
    (q_max - q_min), zero = q_min - round(min / scale), clamped."""
    q_min, q_max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    mn = np.minimum(x_groups.min(axis=-1), 0)
    mx = np.maximum(x_groups.max(axis=-1), 0)
    if symmetric:
        scale = np.maximum(np.abs(mn), np.abs(mx)) / ((q_max - q_min) / 2)
        zero = np.zeros_like(scale)
    else:
        scale = (mx - mn) / (q_max - q_min)
        scale16 = scale.astype(np.float16).astype(np.float32)
        zero = np.clip(q_min - np.round(mn / scale16), q_min, q_max)
    return scale.astype(np.float16), zero.astype(np.int64)


def ct_pack_folder(rng):
    bits, group, inter = 4, 4, 44
    q_min, q_max = -8, 7
    tensors, expected = {}, {}
    for n, W in weights(rng, inter).items():
        out, infeatures = W.shape
        g = W.reshape(out, infeatures // group, group)
        scale, zero = ct_qparams(g, bits, False)          # [out, groups]
        s32 = scale.astype(np.float32)[:, :, None]
        q = np.clip(np.round(g / s32 + zero[:, :, None]), q_min, q_max).astype(np.int64)   # _quantize
        q = q.reshape(out, infeatures)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.weight_packed"] = pack_to_int32(q, bits)
        tensors[f"{p}.weight_scale"] = scale
        tensors[f"{p}.weight_zero_point"] = pack_to_int32(zero, bits, packed_dim=0)
        tensors[f"{p}.weight_shape"] = np.array([out, infeatures], np.int64)
        # _dequantize on what a reader unpacks: (q - zp) * scale, exact in float32
        qu = unpack_from_int32(tensors[f"{p}.weight_packed"], bits, (out, infeatures))
        zu = unpack_from_int32(tensors[f"{p}.weight_zero_point"], bits, zero.shape, packed_dim=0)
        assert (qu == q).all() and (zu == zero).all()
        zr = np.repeat(zu, group, axis=1)
        sr = np.repeat(scale.astype(np.float32), group, axis=1)
        expected[n] = (qu - zr).astype(np.float32) * sr
    config = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": bits, "type": "int", "symmetric": False, "strategy": "group",
                        "group_size": group, "dynamic": False}}},
    }
    write_folder("ct_pack_int4_asym", inter, config, tensors, expected, rng)


def ct_fp8_folder(rng):
    inter = 44
    tensors, expected = {}, {}
    for n, W in weights(rng, inter).items():
        # float_quantized.py: scale = amax / 448 per channel (model dtype BF16), weight cast to FP8
        scale = (np.abs(W).max(axis=1, keepdims=True) / 448.0).astype(ml_dtypes.bfloat16)
        q = (W / scale.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.weight"], tensors[f"{p}.weight_scale"] = q, scale
        expected[n] = q.astype(np.float32) * scale.astype(np.float32)
    act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    config = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": act,
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                        "dynamic": False}}},
    }
    write_folder("ct_fp8_channel", inter, config, tensors, expected, rng)


# ---------------------------------------------------------------- FP8 blocks (DeepSeek-V3)

def fp8_block_folder(rng):
    inter, b = 44, 16
    tensors, expected = {}, {}
    for n, W in weights(rng, inter).items():
        out, infeatures = W.shape
        br, bc = -(-out // b), -(-infeatures // b)
        s = np.zeros((br, bc), np.float32)
        for i in range(br):
            for j in range(bc):
                s[i, j] = np.abs(W[i * b:(i + 1) * b, j * b:(j + 1) * b]).max() / 448.0
        s_full = np.repeat(np.repeat(s, b, axis=0), b, axis=1)[:out, :infeatures]
        q = (W / s_full).astype(ml_dtypes.float8_e4m3fn)
        p = f"model.layers.0.{n}"
        tensors[f"{p}.weight"], tensors[f"{p}.weight_scale_inv"] = q, s
        expected[n] = q.astype(np.float32) * s_full          # weight_dequant: x.float() * s
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [b, b]}
    write_folder("fp8_block", inter, config, tensors, expected, rng)


def main():
    rng = np.random.default_rng(15)
    gptq_folder("gptq_v1_4bit_desc_act", rng, bits=4, group=16, sym=True, desc_act=True, v1=True)
    gptq_folder("gptq_v2_8bit_asym", rng, bits=8, group=16, sym=False, desc_act=False, v1=False)
    awq_folder(rng)
    ct_pack_folder(rng)
    ct_fp8_folder(rng)
    fp8_block_folder(rng)


if __name__ == "__main__":
    main()
