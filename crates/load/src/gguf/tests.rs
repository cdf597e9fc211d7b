//! GGUF files built in memory by a small writer, one test per way a file can be wrong, and the
//! SmolLM2 GGUF from `models/` when it is present.

use std::path::Path;

use qdrift_ggml::{GgmlType, dequantize_ggml_blocks, quantize_ggml_blocks};

use super::read::{GgufModel, GgufValue};
use super::{parse_gguf, read_gguf};
use crate::{HostModel, HostTensor, LoadError, RopeScaling};

const F32: u32 = 0;
const F16: u32 = 1;
const Q8_0: u32 = 8;
const BF16: u32 = 30;

/// A minimal GGUF writer (little-endian, as `gguf-py`'s `GGUFWriter` lays files out).
struct Writer {
    magic: [u8; 4],
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    /// (name, GGUF dims ne0 first, type id, data bytes)
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    /// Added to every tensor's stored offset.
    offset_bias: u64,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn new() -> Self {
        Writer { magic: *b"GGUF", version: 3, kv: vec![], n_kv: 0, tensors: vec![], offset_bias: 0 }
    }

    fn kv_raw(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        put_str(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }

    fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv_raw(key, 4, &v.to_le_bytes())
    }

    fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.kv_raw(key, 6, &v.to_le_bytes())
    }

    fn string(&mut self, key: &str, v: &str) -> &mut Self {
        let mut b = vec![];
        put_str(&mut b, v);
        self.kv_raw(key, 8, &b)
    }

    fn strings(&mut self, key: &str, v: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut b, s);
        }
        self.kv_raw(key, 9, &b)
    }

    /// A tensor given in HostModel's shape (outermost first) and row-major values.
    fn tensor(&mut self, name: &str, shape: &[usize], ty: u32, values: &[f32]) -> &mut Self {
        let data = match ty {
            F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
            BF16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
            Q8_0 => quantize_ggml_blocks(GgmlType::Q8_0, values).unwrap(),
            _ => vec![0; 64],
        };
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), dims, ty, data));
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.wrapping_add(self.offset_bias).to_le_bytes());
            offset = (offset + data.len() as u64).div_ceil(32) * 32;
        }
        // The data section starts aligned even when it is empty, as gguf-py writes it.
        out.resize(out.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in &self.tensors {
            out.resize(out.len().div_ceil(32) * 32, 0);
            out.extend(data);
        }
        out
    }
}

/// Values exactly representable in f16 and bf16 (multiples of 1/8 in [-1, 1]).
fn values(seed: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 13) % 17) as f32 / 8.0 - 1.0).collect()
}

const DIM: usize = 8;
const HIDDEN: usize = 32;
const VOCAB: usize = 16;
const KV_DIM: usize = 4; // 2 heads of 4, 1 KV head

/// A tiny llama: dim 8, 1 layer, 2 heads / 1 KV head, hidden 32, vocab 16, untied output.
fn tiny() -> Writer {
    let mut w = Writer::new();
    w.string("general.architecture", "llama")
        .u32("general.alignment", 32)
        .u32("llama.embedding_length", DIM as u32)
        .u32("llama.feed_forward_length", HIDDEN as u32)
        .u32("llama.block_count", 1)
        .u32("llama.attention.head_count", 2)
        .u32("llama.attention.head_count_kv", 1)
        .u32("llama.context_length", 64)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-6)
        .f32("llama.rope.freq_base", 500000.0)
        .string("tokenizer.ggml.model", "gpt2")
        .strings("tokenizer.ggml.tokens", &["a", "b", "c"])
        .strings("tokenizer.ggml.merges", &["a b"])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .kv_raw("tokenizer.ggml.add_bos_token", 7, &[0]);
    w.tensor("token_embd.weight", &[VOCAB, DIM], F16, &values(0, VOCAB * DIM))
        .tensor("blk.0.attn_norm.weight", &[DIM], F32, &values(1, DIM))
        .tensor("blk.0.attn_q.weight", &[DIM, DIM], F32, &values(2, DIM * DIM))
        .tensor("blk.0.attn_k.weight", &[KV_DIM, DIM], F16, &values(3, KV_DIM * DIM))
        .tensor("blk.0.attn_v.weight", &[KV_DIM, DIM], BF16, &values(4, KV_DIM * DIM))
        .tensor("blk.0.attn_output.weight", &[DIM, DIM], F32, &values(5, DIM * DIM))
        .tensor("blk.0.ffn_norm.weight", &[DIM], F32, &values(6, DIM))
        .tensor("blk.0.ffn_gate.weight", &[HIDDEN, DIM], F32, &values(7, HIDDEN * DIM))
        .tensor("blk.0.ffn_up.weight", &[HIDDEN, DIM], F32, &values(8, HIDDEN * DIM))
        .tensor("blk.0.ffn_down.weight", &[DIM, HIDDEN], Q8_0, &values(9, DIM * HIDDEN))
        .tensor("output_norm.weight", &[DIM], F32, &values(10, DIM))
        .tensor("output.weight", &[VOCAB, DIM], F32, &values(11, VOCAB * DIM));
    w
}

fn parse(bytes: &[u8]) -> Result<GgufModel, LoadError> {
    parse_gguf(Path::new("tiny.gguf"), bytes)
}

fn error(bytes: &[u8]) -> String {
    parse(bytes).expect_err("should be rejected").to_string()
}

fn t(shape: &[usize], seed: usize) -> HostTensor {
    HostTensor::new(shape.to_vec(), values(seed, shape.iter().product())).unwrap()
}

#[test]
fn tiny_llama_round_trips() {
    let g = parse(&tiny().build()).expect("valid file");
    let m: &HostModel = &g.model;
    let a = &m.arch;
    assert_eq!(
        (a.architecture.as_str(), a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab_size),
        ("llama", DIM, HIDDEN, 1, 2, 1, VOCAB)
    );
    assert_eq!((a.max_seq_len, a.norm_eps, a.rope_theta, a.tied_embeddings), (64, 1e-6, 500000.0, false));
    assert_eq!(m.token_embedding, t(&[VOCAB, DIM], 0));
    let l = &m.layers[0];
    assert_eq!(l.attn_norm, t(&[DIM], 1));
    assert_eq!(l.wq, t(&[DIM, DIM], 2));
    assert_eq!(l.wk, t(&[KV_DIM, DIM], 3));
    assert_eq!(l.wv, t(&[KV_DIM, DIM], 4));
    assert_eq!(l.wo, t(&[DIM, DIM], 5));
    assert_eq!(l.ffn_norm, t(&[DIM], 6));
    assert_eq!(l.mlp().expect("dense").gate, t(&[HIDDEN, DIM], 7));
    assert_eq!(l.mlp().expect("dense").up, t(&[HIDDEN, DIM], 8));
    let q8 = quantize_ggml_blocks(GgmlType::Q8_0, &values(9, DIM * HIDDEN)).unwrap();
    let want_down = dequantize_ggml_blocks(GgmlType::Q8_0, &q8, DIM * HIDDEN).unwrap();
    assert_eq!(l.mlp().expect("dense").down.shape, [DIM, HIDDEN]);
    assert_eq!(l.mlp().expect("dense").down.data, want_down);
    assert_eq!(m.final_norm, t(&[DIM], 10));
    assert_eq!(m.output, Some(t(&[VOCAB, DIM], 11)));

    assert_eq!(g.version, 3);
    assert_eq!(g.tokenizer.model.as_deref(), Some("gpt2"));
    assert_eq!(g.tokenizer.tokens, ["a", "b", "c"]);
    assert_eq!(g.tokenizer.merges, ["a b"]);
    assert_eq!((g.tokenizer.bos_token_id, g.tokenizer.eos_token_id), (Some(1), Some(2)));
    assert_eq!(g.tokenizer.add_bos_token, Some(false));
    assert_eq!(g.tokenizer.scores, None);
    assert_eq!(g.metadata.get("llama.block_count"), Some(&GgufValue::U32(1)));
    let types: Vec<&str> = g.tensor_types.iter().map(|(_, t)| *t).collect();
    assert_eq!(types, ["F16", "F32", "F32", "F16", "BF16", "F32", "F32", "F32", "F32", "Q8_0", "F32", "F32"]);
    assert_eq!(g.tensor_types[9].0, "blk.0.ffn_down.weight");
}

#[test]
fn missing_output_means_tied_and_version_2_reads() {
    let mut w = tiny();
    w.tensors.retain(|t| t.0 != "output.weight");
    w.version = 2;
    let g = parse(&w.build()).expect("valid file");
    assert!(g.model.arch.tied_embeddings);
    assert_eq!(g.model.output, None);
}

#[test]
fn bad_magic() {
    let mut w = tiny();
    w.magic = *b"GGML";
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: not a GGUF file: magic is [47, 47, 4d, 4c], expected \"GGUF\" (47 47 55 46)"
    );
}

#[test]
fn unsupported_version() {
    let mut w = tiny();
    w.version = 1;
    assert_eq!(error(&w.build()), "tiny.gguf: GGUF version 1 is not supported; supported: 2, 3");
    w.version = 3u32.swap_bytes();
    assert!(error(&w.build()).contains("big-endian"));
}

#[test]
fn truncated_file() {
    let bytes = tiny().build();
    // Cut inside the tensor infos, inside the data, and inside the header.
    for cut in [bytes.len() - 1, bytes.len() / 2, 300, 20, 3, 0] {
        let e = error(&bytes[..cut]);
        assert!(e.starts_with("tiny.gguf: "), "{cut}: {e}");
        assert!(e.contains("truncated") || e.contains("past the end") || e.contains("remain"), "{cut}: {e}");
    }
    assert_eq!(
        error(&bytes[..300]),
        error(&bytes[..300]), // deterministic
    );
    let e = error(&bytes[..bytes.len() - 1]);
    assert!(e.contains("tensor output.weight") && e.contains("run past the end of the data section"), "{e}");
}

#[test]
fn header_count_beyond_file() {
    let mut bytes = tiny().build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // tensor count
    let e = error(&bytes);
    assert!(e.starts_with("tiny.gguf: the header's tensor count declares 18446744073709551615 entries"), "{e}");
    let mut bytes = tiny().build();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes()); // metadata count
    let e = error(&bytes);
    assert!(e.contains("metadata count declares 1099511627776 entries"), "{e}");
    // An array count beyond the file.
    let mut w = Writer::new();
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend(u64::MAX.to_le_bytes());
    w.kv_raw("tokenizer.ggml.tokens", 9, &arr);
    let e = error(&w.build());
    assert!(e.contains("metadata value tokenizer.ggml.tokens declares 18446744073709551615 entries"), "{e}");
    // A string length beyond the file.
    let mut w = Writer::new();
    w.kv_raw("general.architecture", 8, &u64::MAX.to_le_bytes());
    let e = error(&w.build());
    assert!(e.contains("truncated: metadata value general.architecture needs 18446744073709551615 bytes"), "{e}");
}

#[test]
fn tensor_offset_out_of_range() {
    let mut w = tiny();
    w.offset_bias = 1 << 20;
    let e = error(&w.build());
    assert!(
        e.starts_with("tiny.gguf: tensor token_embd.weight: 256 bytes at data offset 1048576 run past the end"),
        "{e}"
    );
    let mut w = tiny();
    w.offset_bias = u64::MAX - 10;
    assert!(error(&w.build()).contains("run past the end"));
}

#[test]
fn unreadable_tensor_types_are_refused_by_their_ggml_name() {
    let mut w = tiny();
    w.tensors[3].2 = 16; // IQ2_XXS
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: tensor blk.0.attn_k.weight has type IQ2_XXS (16), which qdrift cannot read; \
         it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4"
    );
    for (id, name) in [
        (17, "IQ2_XS"),
        (22, "IQ2_S"),
        (18, "IQ3_XXS"),
        (21, "IQ3_S"),
        (19, "IQ1_S"),
        (29, "IQ1_M"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
        (15, "Q8_K"),
        (28, "F64"),
        (41, "Q1_0"),
    ] {
        w.tensors[3].2 = id;
        let e = error(&w.build());
        assert!(
            e.contains(&format!("tensor blk.0.attn_k.weight has type {name} ({id}), which qdrift cannot read")),
            "{e}"
        );
    }
    w.tensors[3].2 = 99;
    let e = error(&w.build());
    assert!(e.contains("has type 99 (not a known ggml type), which qdrift cannot read; it reads F32,"), "{e}");
}

/// `n_blocks` blocks of `ty` of seeded random bytes whose f16 (E8M0 for MXFP4) scale fields hold
/// ±2^-6, so every dequantized value is finite and of moderate size.
fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u32) -> Vec<u8> {
    let mut state = seed | 1;
    let mut bytes: Vec<u8> = (0..n_blocks * ty.type_size())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 24) as u8
        })
        .collect();
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Iq4Nl | GgmlType::Iq4Xs => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        GgmlType::Mxfp4 | GgmlType::Nvfp4 => &[],
    };
    for (b, block) in bytes.chunks_exact_mut(ty.type_size()).enumerate() {
        for &o in scale_offsets {
            let sign = if (b + o) % 3 == 0 { -1.0 } else { 1.0 };
            block[o..o + 2].copy_from_slice(&half::f16::from_f32(sign * 2f32.powi(-6)).to_le_bytes());
        }
        if ty == GgmlType::Mxfp4 {
            block[0] = 120; // E8M0 2^-7
        }
    }
    bytes
}

/// A matrix of [`mixed_types_llama`]: tensor name, type, HostModel shape, bytes.
type BlockMatrix = (&'static str, GgmlType, [usize; 2], Vec<u8>);

/// A llama with `ne0 = 256` rows whose matrices are each in another GGML type, every type of
/// `GgmlType::READABLE` among them: the file and its matrices.
fn mixed_types_llama() -> (Writer, Vec<BlockMatrix>) {
    const D: usize = 256;
    const KV: usize = 128; // 2 heads of 128, 1 KV head
    const V: usize = 16;
    let matrices: Vec<(&str, GgmlType, [usize; 2])> = vec![
        ("token_embd.weight", GgmlType::Q5_0, [V, D]),
        ("blk.0.attn_q.weight", GgmlType::Q2K, [D, D]),
        ("blk.0.attn_k.weight", GgmlType::Q3K, [KV, D]),
        ("blk.0.attn_v.weight", GgmlType::Q5K, [KV, D]),
        ("blk.0.attn_output.weight", GgmlType::Iq4Xs, [D, D]),
        ("blk.0.ffn_gate.weight", GgmlType::Iq4Nl, [D, D]),
        ("blk.0.ffn_up.weight", GgmlType::Q5_1, [D, D]),
        ("blk.0.ffn_down.weight", GgmlType::Q4K, [D, D]),
        ("blk.1.attn_q.weight", GgmlType::Q4_0, [D, D]),
        ("blk.1.attn_k.weight", GgmlType::Q4_1, [KV, D]),
        ("blk.1.attn_v.weight", GgmlType::Q8_0, [KV, D]),
        ("blk.1.attn_output.weight", GgmlType::Q6K, [D, D]),
        ("blk.1.ffn_gate.weight", GgmlType::Mxfp4, [D, D]),
        ("blk.1.ffn_up.weight", GgmlType::Nvfp4, [D, D]),
        ("blk.1.ffn_down.weight", GgmlType::Q3K, [D, D]),
        ("output.weight", GgmlType::Q5K, [V, D]),
    ];
    let mut w = Writer::new();
    w.string("general.architecture", "llama")
        .u32("llama.embedding_length", D as u32)
        .u32("llama.feed_forward_length", D as u32)
        .u32("llama.block_count", 2)
        .u32("llama.attention.head_count", 2)
        .u32("llama.attention.head_count_kv", 1)
        .u32("llama.context_length", 64)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-6)
        .f32("llama.rope.freq_base", 10000.0)
        .string("tokenizer.ggml.model", "gpt2")
        // As many tokens as the embedding has rows, so that `open_model` accepts the file.
        .strings(
            "tokenizer.ggml.tokens",
            &["a", "b", "ab", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o"],
        )
        .strings("tokenizer.ggml.merges", &["a b"])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .kv_raw("tokenizer.ggml.add_bos_token", 7, &[0]);
    let mut out = Vec::new();
    for (i, (name, ty, shape)) in matrices.into_iter().enumerate() {
        let bytes = random_blocks(ty, shape[0] * shape[1] / ty.block_size(), 0x5eed_0000 + i as u32);
        let dims = vec![shape[1] as u64, shape[0] as u64];
        w.tensors.push((name.to_string(), dims, ty.gguf_id(), bytes.clone()));
        if name == "blk.0.ffn_down.weight" || name == "blk.1.ffn_down.weight" {
            let layer = &name[..5]; // `blk.N`
            w.tensor(&format!("{layer}.attn_norm.weight"), &[D], F32, &values(i, D));
            w.tensor(&format!("{layer}.ffn_norm.weight"), &[D], F32, &values(i + 1, D));
        }
        out.push((name, ty, shape, bytes));
    }
    w.tensor("output_norm.weight", &[D], F32, &values(99, D));
    (w, out)
}

#[test]
fn every_readable_ggml_type_reads_as_qdrift_ggml_dequantizes_it() {
    let (w, matrices) = mixed_types_llama();
    for ty in GgmlType::READABLE {
        assert!(matrices.iter().any(|m| m.1 == ty), "{ty} is not in the file");
    }
    let g = parse(&w.build()).expect("valid file");
    let m = &g.model;
    let l0 = &m.layers[0];
    let l1 = &m.layers[1];
    let read: Vec<(&str, &HostTensor)> = vec![
        ("token_embd.weight", &m.token_embedding),
        ("blk.0.attn_q.weight", &l0.wq),
        ("blk.0.attn_k.weight", &l0.wk),
        ("blk.0.attn_v.weight", &l0.wv),
        ("blk.0.attn_output.weight", &l0.wo),
        ("blk.0.ffn_gate.weight", &l0.mlp().expect("dense").gate),
        ("blk.0.ffn_up.weight", &l0.mlp().expect("dense").up),
        ("blk.0.ffn_down.weight", &l0.mlp().expect("dense").down),
        ("blk.1.attn_q.weight", &l1.wq),
        ("blk.1.attn_k.weight", &l1.wk),
        ("blk.1.attn_v.weight", &l1.wv),
        ("blk.1.attn_output.weight", &l1.wo),
        ("blk.1.ffn_gate.weight", &l1.mlp().expect("dense").gate),
        ("blk.1.ffn_up.weight", &l1.mlp().expect("dense").up),
        ("blk.1.ffn_down.weight", &l1.mlp().expect("dense").down),
        ("output.weight", m.output.as_ref().expect("untied")),
    ];
    for ((name, ty, shape, bytes), (read_name, tensor)) in matrices.iter().zip(&read) {
        assert_eq!(name, read_name);
        let want = dequantize_ggml_blocks(*ty, bytes, shape[0] * shape[1]).unwrap();
        assert_eq!(tensor.shape, shape, "{name}");
        assert!(tensor.data.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} ({ty})");
        assert!(want.iter().any(|&v| v != 0.0), "{name}: all zero");
    }
    let types: Vec<(&str, &str)> = g.tensor_types.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    assert!(types.contains(&("blk.0.attn_output.weight", "IQ4_XS")), "{types:?}");
    assert!(types.contains(&("blk.0.ffn_up.weight", "Q5_1")), "{types:?}");
    // The stored sizes: `elements / block · type size` per tensor.
    let sizes: Vec<_> = g.tensors.iter().filter(|t| t.name == "blk.0.attn_k.weight").collect();
    assert_eq!(sizes.len(), 1);
    assert_eq!((sizes[0].dtype, sizes[0].elements, sizes[0].bytes), ("Q3_K", 128 * 256, 128 * 110));
    assert_eq!(sizes[0].dims, [256, 128]);
}

#[test]
fn new_types_need_whole_blocks_of_their_own_size() {
    // A Q3_K row of 128 values is half a super-block: refused before any data is read.
    let (mut w, _) = mixed_types_llama();
    let t = w.tensors.iter_mut().find(|t| t.0 == "blk.0.attn_k.weight").unwrap();
    t.1 = vec![128, 256];
    let e = error(&w.build());
    assert!(
        e.contains("tensor blk.0.attn_k.weight: dims [128, 256] are not a whole number of Q3_K blocks of 256 elements"),
        "{e}"
    );
    // A Q5_0 row of 16 values is half a block of 32.
    let (mut w, _) = mixed_types_llama();
    let t = w.tensors.iter_mut().find(|t| t.0 == "token_embd.weight").unwrap();
    t.1 = vec![16, 256];
    assert!(error(&w.build()).contains("are not a whole number of Q5_0 blocks of 32 elements"));
}

#[test]
fn a_mixed_file_is_inspected_per_type() {
    let (w, matrices) = mixed_types_llama();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.gguf");
    std::fs::write(&path, w.build()).unwrap();
    let loaded = crate::open_model(&path, None).expect("opens");
    let storage = loaded.source_storage.clone().expect("GGUF files carry their storage");
    // 16 matrices + 2·2 layer norms + the final norm.
    assert_eq!(storage.tensors, 16 + 5);
    let of = |dtype: &str| storage.by_type.iter().find(|t| t.dtype == dtype).expect(dtype).clone();
    // Q2_K: blk.0.attn_q, 256·256, 84 bytes per 256.
    let q2k = of("Q2_K");
    assert_eq!((q2k.tensors, q2k.elements, q2k.bytes), (1, 65_536, 256 * 84));
    assert_eq!(q2k.bits_per_weight, 2.625);
    // NVFP4: blk.1.ffn_up, 256·256, 36 bytes per 64.
    let nvfp4 = of("NVFP4");
    assert_eq!((nvfp4.tensors, nvfp4.elements, nvfp4.bytes), (1, 65_536, 1024 * 36));
    assert_eq!(nvfp4.bits_per_weight, 4.5);
    // Q5_K: attn_v (128·256) and output (16·256); 176 bytes per 256 = 5.5 bits.
    let q5k = of("Q5_K");
    assert_eq!((q5k.tensors, q5k.elements, q5k.bytes), (2, 144 * 256, 144 * 176));
    assert_eq!(q5k.bits_per_weight, 5.5);
    let f32s = of("F32");
    assert_eq!((f32s.tensors, f32s.elements, f32s.bytes), (5, 5 * 256, 5 * 256 * 4));
    let matrix_bytes: u64 = matrices.iter().map(|m| m.3.len() as u64).sum();
    let matrix_elements: u64 = matrices.iter().map(|m| (m.2[0] * m.2[1]) as u64).sum();
    assert_eq!(storage.bytes, matrix_bytes + 5 * 256 * 4);
    assert_eq!(storage.elements, matrix_elements + 5 * 256);
    assert_eq!(storage.bits_per_weight, 8.0 * storage.bytes as f64 / storage.elements as f64);
    assert_eq!(storage.by_type.iter().map(|t| t.tensors).sum::<usize>(), storage.tensors);
    // Most bytes first.
    assert!(storage.by_type.windows(2).all(|p| p[0].bytes >= p[1].bytes));

    let i = crate::inspect::inspect_loaded(&loaded, 64, 1, &[&crate::inspect::Fp32]).expect("fits");
    assert_eq!(i.source_storage, Some(storage));
    let text = i.to_string();
    assert!(text.contains("source storage: "), "{text}");
    assert!(
        text.contains("  NVFP4        1 tensors           65,536 weights           36,864 B    4.50 bits/weight"),
        "{text}"
    );
}

#[test]
fn missing_tensor() {
    let mut w = tiny();
    w.tensors.retain(|t| t.0 != "blk.0.ffn_up.weight");
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: tensor blk.0.ffn_up.weight is missing; expected dims [8, 32] (ne0 first)"
    );
}

#[test]
fn wrong_shape() {
    let mut w = tiny();
    w.tensors.retain(|t| t.0 != "blk.0.attn_k.weight");
    w.tensor("blk.0.attn_k.weight", &[DIM, DIM], F32, &values(3, DIM * DIM));
    assert_eq!(error(&w.build()), "tiny.gguf: tensor blk.0.attn_k.weight has dims [8, 8]; expected [8, 4] (ne0 first)");
}

#[test]
fn unsupported_architecture() {
    let mut w = Writer::new();
    w.string("general.architecture", "gpt2");
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: unsupported architecture gpt2; supported: llama (with or without experts), qwen2, qwen3, \
         qwen3moe, qwen2moe, gemma2, gemma3, phi3, gpt-oss, smollm3, glm4moe"
    );
}

fn factors(w: &Writer) -> Option<Vec<f32>> {
    match parse(&w.build()).expect("valid file").model.arch.rope_scaling {
        None => None,
        Some(RopeScaling::FreqFactors { factors }) => Some(factors),
        Some(other) => panic!("unexpected {other:?}"),
    }
}

#[test]
fn rope_freqs_weight_becomes_per_pair_divisors() {
    // head_dim 4: two rotation pairs.
    let mut w = tiny();
    assert_eq!(factors(&w), None);
    w.tensor("rope_freqs.weight", &[2], F32, &[1.0, 4.0]);
    assert_eq!(factors(&w), Some(vec![1.0, 4.0]));
    w.tensors.last_mut().unwrap().1 = vec![3];
    w.tensors.last_mut().unwrap().3.extend(1f32.to_le_bytes());
    assert_eq!(error(&w.build()), "tiny.gguf: tensor rope_freqs.weight has dims [3]; expected [2] (ne0 first)");
    let mut w = tiny();
    w.tensor("rope_freqs.weight", &[2], F32, &[1.0, -4.0]);
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: tensor rope_freqs.weight: rope scaling frequency factor -4 must be positive"
    );
}

#[test]
fn linear_rope_scaling_follows_llama_cpp() {
    // No type key: llama.cpp's default is linear, so the factor applies.
    let mut w = tiny();
    w.f32("llama.rope.scaling.factor", 2.0);
    assert_eq!(factors(&w), Some(vec![2.0, 2.0]));
    // The older key, combined with rope_freqs.weight.
    let mut w = tiny();
    w.f32("llama.rope.scale_linear", 4.0).tensor("rope_freqs.weight", &[2], F32, &[1.0, 3.0]);
    assert_eq!(factors(&w), Some(vec![4.0, 12.0]));
    // `none` ignores the factor, as llama.cpp does.
    let mut w = tiny();
    w.string("llama.rope.scaling.type", "none").f32("llama.rope.scaling.factor", 2.0);
    assert_eq!(factors(&w), None);
    let mut w = tiny();
    w.string("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 1.0);
    assert_eq!(factors(&w), None);
    let mut w = tiny();
    w.string("llama.rope.scaling.type", "yarn").f32("llama.rope.scaling.factor", 4.0);
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: llama.rope.scaling.type = yarn is not supported; supported: none, linear \
         (and per-pair factors in rope_freqs.weight)"
    );
}

#[test]
fn partial_rotary_dimensions_are_refused() {
    let mut w = tiny();
    w.u32("llama.rope.dimension_count", 2);
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: llama.rope.dimension_count is 2 but the head dimension is 4: partial rotary \
         embeddings are not supported"
    );
    let mut w = tiny();
    w.u32("llama.rope.dimension_count", 4);
    parse(&w.build()).expect("equal to the head dimension");
}

#[test]
fn biases_other_than_qkv_are_refused_and_llama_qkv_biases_are_read_as_stored() {
    let mut w = tiny();
    w.tensor("blk.0.attn_q.bias", &[DIM], F32, &values(20, DIM));
    let l = parse(&w.build()).expect("valid").model.layers[0].clone();
    // llama: q/k are stored interleaved already; biases optional, one by one.
    assert_eq!(l.bq, Some(t(&[DIM], 20)));
    assert_eq!((l.bk, l.bv), (None, None));
    w.tensor("blk.0.attn_output.bias", &[DIM], F32, &values(21, DIM));
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: tensor blk.0.attn_output.bias: biases other than blk.N.attn_q/attn_k/attn_v.bias \
         are not supported"
    );
}

/// `tiny()` as a `qwen2` file: `qwen2.*` keys and q/k/v biases.
fn tiny_qwen2() -> Writer {
    let mut w = tiny();
    let mut kv = Writer::new();
    kv.string("general.architecture", "qwen2");
    let llama = tiny();
    // Re-key the hyper-parameters: rebuild the metadata with `qwen2.` in place of `llama.`.
    let g = parse(&llama.build()).expect("valid");
    for (k, v) in &g.metadata {
        if k == "general.architecture" {
            continue;
        }
        let key = k.strip_prefix("llama.").map_or(k.clone(), |r| format!("qwen2.{r}"));
        match v {
            GgufValue::U32(x) => {
                kv.u32(&key, *x);
            }
            GgufValue::F32(x) => {
                kv.f32(&key, *x);
            }
            GgufValue::String(x) => {
                kv.string(&key, x);
            }
            GgufValue::Bool(b) => {
                kv.kv_raw(&key, 7, &[u8::from(*b)]);
            }
            GgufValue::Array(a) => {
                let strs: Vec<&str> = a.iter().filter_map(GgufValue::as_str).collect();
                kv.strings(&key, &strs);
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    w.kv = kv.kv;
    w.n_kv = kv.n_kv;
    let rows = |n: usize| (0..n).map(|r| r as f32).collect::<Vec<_>>();
    w.tensor("blk.0.attn_q.bias", &[DIM], F32, &rows(DIM))
        .tensor("blk.0.attn_k.bias", &[KV_DIM], F32, &rows(KV_DIM))
        .tensor("blk.0.attn_v.bias", &[KV_DIM], F32, &rows(KV_DIM));
    w
}

#[test]
fn qwen2_reads_biases_and_unpermutes_rotate_half_rows() {
    let g = parse(&tiny_qwen2().build()).expect("valid qwen2 file");
    let m = &g.model;
    assert_eq!(m.arch.architecture, "qwen2");
    assert_eq!((m.arch.dim, m.arch.n_heads, m.arch.n_kv_heads), (DIM, 2, 1));
    let l = &m.layers[0];
    // head_dim 4: stored (rotate-half) row h·4 + a·2 + i is interleaved row h·4 + 2i + a, so the
    // interleaved rows are stored rows 0, 2, 1, 3 of each head.
    let order = [0usize, 2, 1, 3, 4, 6, 5, 7];
    assert_eq!(l.bq.as_ref().expect("bq").data, order.map(|r| r as f32).to_vec());
    assert_eq!(l.bk.as_ref().expect("bk").data, [0.0, 2.0, 1.0, 3.0]);
    assert_eq!(l.bv.as_ref().expect("bv").data, [0.0, 1.0, 2.0, 3.0]);
    let stored = t(&[DIM, DIM], 2);
    for (row, &src) in order.iter().enumerate() {
        assert_eq!(l.wq.data[row * DIM..][..DIM], stored.data[src * DIM..][..DIM], "wq row {row}");
    }
    assert_eq!(l.wv, t(&[KV_DIM, DIM], 4), "v is not rotated");

    let mut w = tiny_qwen2();
    w.tensors.retain(|t| t.0 != "blk.0.attn_v.bias");
    assert_eq!(error(&w.build()), "tiny.gguf: tensor blk.0.attn_v.bias is missing; expected dims [4] (ne0 first)");
}

#[test]
fn no_panic_on_any_single_byte_corruption_of_the_header() {
    let bytes = tiny().build();
    let header_end = bytes.len() - 4000.min(bytes.len() / 2);
    for i in (0..header_end).step_by(7) {
        for v in [0x00, 0xFF, 0x80] {
            let mut b = bytes.clone();
            b[i] = v;
            let _ = parse(&b);
        }
    }
}

#[test]
fn open_model_refuses_a_gguf_whose_tokenizer_has_fewer_tokens_than_the_model() {
    let path = std::env::temp_dir().join(format!("qdrift-gguf-open-{}.gguf", std::process::id()));
    std::fs::write(&path, tiny().build()).unwrap();
    let result = crate::open_model(&path, None);
    let _ = std::fs::remove_file(&path);
    let e = result.err().expect("refused");
    assert!(matches!(e, LoadError::VocabMismatch { tokenizer_vocab: 3, model_vocab: VOCAB, .. }), "{e}");
    let p = path.display();
    assert_eq!(e.to_string(), format!("tokenizer {p} has 3 tokens but model {p} has a vocabulary of {VOCAB}"));
}

/// The SmolLM2 GGUF of `models/` (if fetched): the facts llama.cpp's `gguf-dump` reports.
#[test]
fn smollm2_q4_1_gguf() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        println!("skipped: {} is absent", path.display());
        return;
    }
    let g = read_gguf(&path).expect("readable");
    let a = &g.model.arch;
    println!("{a:?}");
    println!(
        "tokenizer model {:?}, {} tokens, {} merges, bos {:?}, eos {:?}, add_bos {:?}",
        g.tokenizer.model,
        g.tokenizer.tokens.len(),
        g.tokenizer.merges.len(),
        g.tokenizer.bos_token_id,
        g.tokenizer.eos_token_id,
        g.tokenizer.add_bos_token
    );
    assert_eq!(g.version, 3);
    assert_eq!((a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.vocab_size), (30, 576, 9, 3, 49_152));
    assert!(a.tied_embeddings);
    assert_eq!(g.model.layers.len(), 30);
    assert_eq!(g.tokenizer.tokens.len(), 49_152);
    let ty = |name: &str| g.tensor_types.iter().find(|t| t.0 == name).map(|t| t.1);
    assert_eq!(ty("token_embd.weight"), Some("Q8_0"));
    assert_eq!(ty("output_norm.weight"), Some("F32"));
    for i in 0..30 {
        for w in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
            assert_eq!(ty(&format!("blk.{i}.{w}.weight")), Some("Q4_1"), "blk.{i}.{w}");
        }
        assert_eq!(ty(&format!("blk.{i}.attn_norm.weight")), Some("F32"));
    }
    let finite = |t: &HostTensor| t.data.iter().all(|v| v.is_finite());
    assert!(
        finite(&g.model.token_embedding)
            && g.model.layers.iter().all(|l| finite(&l.wq) && finite(&l.mlp().expect("dense").down))
    );
}

#[test]
fn more_than_four_dims_are_refused() {
    let mut w = tiny();
    w.tensors[10].1 = vec![DIM as u64, 1, 1, 1, 1];
    assert_eq!(error(&w.build()), "tiny.gguf: tensor output_norm.weight: 5 dimensions; GGUF allows at most 4");
}

#[test]
fn names_of_64_bytes_or_more_are_refused() {
    let mut w = tiny();
    let long = "x".repeat(64);
    w.tensor(&long, &[DIM], F32, &values(1, DIM));
    assert_eq!(error(&w.build()), format!("tiny.gguf: tensor {long}: its name is 64 bytes; GGUF allows at most 63"));
}

#[test]
fn rows_that_are_not_whole_blocks_are_refused() {
    // Q8_0 blocks hold 32 values; a row of 16 cannot be stored.
    let mut w = tiny();
    w.tensors[9].1 = vec![16, 16];
    let e = error(&w.build());
    assert!(
        e.starts_with("tiny.gguf: tensor blk.0.ffn_down.weight: dims [16, 16] are not a whole number of Q8_0"),
        "{e}"
    );
}

#[test]
fn a_nan_block_scale_is_found_after_dequantizing() {
    // Q8_0 block: f16 scale then 32 i8 codes; a NaN scale makes the block's 32 values NaN.
    let mut w = tiny();
    let block = 34;
    w.tensors[9].3[2 * block..2 * block + 2].copy_from_slice(&half::f16::NAN.to_le_bytes());
    assert_eq!(
        error(&w.build()),
        "tiny.gguf: tensor blk.0.ffn_down.weight has a non-finite value (NaN) at flat index 64"
    );
}

#[test]
fn a_metadata_key_written_twice_is_refused() {
    let mut w = tiny();
    w.kv_raw("llama.context_length", 10, &(1u64 << 62).to_le_bytes());
    assert!(error(&w.build()).ends_with("metadata key llama.context_length appears more than once"));
}

/// llama.cpp looks up Phi-3's special tokens when `general.name` says phi3 (and aborts when one
/// is missing): only a vocabulary that has them all is named so.
#[test]
fn a_phi3_name_is_written_only_with_phi3s_special_tokens() {
    let mut arch = crate::synthetic::synthetic_arch("tiny").expect("tiny preset");
    let keys = |tokens: &[&str]| {
        let tokens = tokens.iter().map(|t| GgufValue::String((*t).to_string())).collect();
        vec![("tokenizer.ggml.tokens".to_string(), GgufValue::Array(tokens))]
    };
    let phi3_vocab = keys(&["<unk>", "<s>", "</s>", "<|endoftext|>", "a"]);
    let other_vocab = keys(&["<|endoftext|>", "a"]);
    assert_eq!(super::write::gguf_name(&arch, &other_vocab), arch.architecture, "a llama keeps its name");
    arch.architecture = "phi3".into();
    assert_eq!(super::write::gguf_name(&arch, &phi3_vocab), "phi3");
    assert_eq!(super::write::gguf_name(&arch, &other_vocab), "phi");
    assert_eq!(super::write::gguf_name(&arch, &[]), "phi");
}
