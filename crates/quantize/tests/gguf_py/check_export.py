#!/usr/bin/env python3
"""An independent reader's check of `qdrift quantize --format gguf` (test-only, run by hand).

gguf-py (PyPI `gguf` 0.19.0, llama.cpp's own GGUF library) reads the GGUF file qdrift wrote and
dequantizes every tensor with its numpy dequantizers; each must equal, bit for bit, the
dequantized variant qdrift writes as F32 safetensors for the same scheme (Hugging Face names,
rotate-half q/k rows, brought to GGUF's interleaved order with convert_hf_to_gguf.py's `permute`).

    python3 -m venv /var/tmp/gguf-venv && /var/tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
    cargo build --release --workspace
    /var/tmp/gguf-venv/bin/python crates/quantize/tests/gguf_py/check_export.py \
        target/release/qdrift ../shared/models/stories260K/stories260K.bin > crates/quantize/tests/gguf_py/check_export.txt
    /var/tmp/gguf-venv/bin/python crates/quantize/tests/gguf_py/check_export.py \
        target/release/qdrift synthetic:smollm2-135m q4_k,q6_k | tail -n +2 >> crates/quantize/tests/gguf_py/check_export.txt

stories260K's rows (64, 172) are not whole 256-blocks, so its q4_k/q6_k files hold only the
fallbacks (Q5_0/Q8_0, F16); SmolLM2's shape (576- and 1536-wide rows) stores real Q4_K and Q6_K
blocks next to them.

`check_export.txt` beside this script is the output of the last run.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, quants

SCHEMES = ["fp16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k", "mxfp4"]


def read_safetensors(path: Path) -> dict:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=np.float32).reshape(info["shape"])
    return out


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py `LlamaModel.permute`: rotate-half rows to GGUF's interleaved ones."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    table = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in table:
        return table[hf]
    parts = hf.split(".")
    i, rest = parts[2], ".".join(parts[3:])
    sub = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }[rest]
    return f"blk.{i}.{sub}"


def check(qdrift: str, model: str, scheme: str, tmp: Path) -> None:
    gguf_path, st_path = tmp / f"{scheme}.gguf", tmp / f"{scheme}.safetensors"
    for fmt, out in [("gguf", gguf_path), ("safetensors", st_path)]:
        subprocess.run(
            [qdrift, "quantize", "--model", model, "--scheme", scheme, "--format", fmt, "--out", str(out), "--json"],
            check=True,
            capture_output=True,
        )
    reader = GGUFReader(gguf_path)
    field = lambda k: reader.fields[k]
    arch = bytes(field("general.architecture").parts[-1]).decode()
    n_head = int(field(f"{arch}.attention.head_count").parts[-1][0])
    n_head_kv = int(field(f"{arch}.attention.head_count_kv").parts[-1][0])
    n_tokens = len(field("tokenizer.ggml.tokens").data)
    tensors = {t.name: t for t in reader.tensors}
    reference = read_safetensors(st_path)
    types: dict = {}
    equal = 0
    for hf, want in reference.items():
        name = gguf_name(hf)
        t = tensors[name]
        got = quants.dequantize(t.data, t.tensor_type).reshape(want.shape)
        if arch == "llama" and name.endswith("attn_q.weight"):
            want = permute(want, n_head)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            want = permute(want, n_head_kv)
        assert [int(d) for d in t.shape] == list(reversed(want.shape)), (name, t.shape, want.shape)
        if np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            equal += 1
        else:
            print(f"  {scheme}: {name} ({t.tensor_type.name}) differs", file=sys.stderr)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert set(tensors) == {gguf_name(n) for n in reference}, "tensor names"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(types.items()))
    print(
        f"{scheme:6} {arch}, {len(tensors)} tensors ({kinds}), {n_tokens} tokens, "
        f"{equal}/{len(reference)} tensors bit-equal to qdrift's dequantized variant"
    )
    if equal != len(reference):
        sys.exit(1)


def main() -> None:
    qdrift, model = sys.argv[1], sys.argv[2]
    schemes = sys.argv[3].split(",") if len(sys.argv) > 3 else SCHEMES
    from importlib.metadata import version

    print(f"gguf-py {version('gguf')}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"model {Path(model).name if not model.startswith('synthetic:') else model}")
        for scheme in schemes:
            check(qdrift, model, scheme, Path(tmp))


if __name__ == "__main__":
    main()
