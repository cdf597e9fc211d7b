//! Whole-model quantization and safetensors output on stories260K (dim 64, hidden 172, 5 layers,
//! 8 heads, 4 kv heads, vocab 512, tied embeddings), read in place from `../shared`
//! (override with `QDRIFT_SHARED`). The reference is the checkpoint rounded to FP16.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use qdrift_load::{HostModel, HostTensor, read_llama2c_checkpoint};
use qdrift_quantize::{
    Fp8Format, GgmlType, PackedPart, QuantizeOptions, QuantizedModel, Scheme, WeightSlot, WriteError, quantize,
    quantize_model, rotate_half_row_order, write_safetensors,
};
use safetensors::{Dtype, SafeTensors};

const LAYERS: usize = 5;
const LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

fn shared() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// stories260K with every weight rounded to FP16 (the reference every scheme is measured against).
fn reference() -> HostModel {
    let path = shared().join("models/stories260K/stories260K.bin");
    let mut model = read_llama2c_checkpoint(&path).expect("stories260K loads");
    model.round_to_f16();
    assert_eq!((model.arch.dim, model.arch.hidden_dim, model.layers.len()), (64, 172, LAYERS));
    assert!(model.output.is_none(), "stories260K is tied");
    model
}

/// The same weights with an untied head (a perturbed copy of the embedding).
fn untied(mut model: HostModel) -> HostModel {
    let mut head = model.token_embedding.clone();
    for (i, v) in head.data.iter_mut().enumerate() {
        *v = half::f16::from_f32(*v * if i % 3 == 0 { -1.5 } else { 0.75 }).to_f32();
    }
    model.output = Some(head);
    model.arch.tied_embeddings = false;
    model
}

fn linear<'a>(model: &'a HostModel, layer: usize, short: &str) -> &'a HostTensor {
    model.layers[layer].linears().into_iter().find(|(n, _)| n.role == short).map(|(_, t)| t).expect("known linear")
}

fn slot(layer: usize, short_name: &'static str) -> WeightSlot {
    WeightSlot::Linear { layer, short_name: qdrift_load::LinearName::dense(short_name) }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn all_int4(group: usize) -> Scheme {
    Scheme::Int4 { group, asym: false }
}

#[test]
fn every_scheme_quantizes_stories260k() {
    let reference = reference();
    for scheme in Scheme::all() {
        let q = quantize_model(&reference, &scheme, &QuantizeOptions::default())
            .unwrap_or_else(|e| panic!("{scheme}: {e}"));
        assert_eq!(q.tensors.len(), LAYERS * 7, "{scheme}");
        let names: Vec<String> =
            (0..LAYERS).flat_map(|i| LINEARS.map(|l| format!("model.layers.{i}.{l}.weight"))).collect();
        assert_eq!(q.tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>(), names);
        for t in &q.tensors {
            let s = t.stats.sqnr_db;
            assert!(s.is_finite() || s == f64::INFINITY, "{scheme} {}: SQNR {s}", t.name);
            assert!(t.stats.cosine > 0.9, "{scheme} {}: cosine {}", t.name, t.stats.cosine);
            // The report's SQNR is the same number, with +inf as None.
            let r = t.report();
            assert_eq!(r.sqnr_db, s.is_finite().then_some(s));
        }
        // Not quantized by default: embedding, norms.
        assert_eq!(bits(&q.dequantized.token_embedding.data), bits(&reference.token_embedding.data));
        assert!(q.dequantized.output.is_none());
        for (a, b) in q.dequantized.layers.iter().zip(&reference.layers) {
            assert_eq!(bits(&a.attn_norm.data), bits(&b.attn_norm.data));
            assert_eq!(bits(&a.ffn_norm.data), bits(&b.ffn_norm.data));
        }
        if scheme == Scheme::Fp16 {
            // The reference is already FP16: the identity.
            assert!(q.tensors.iter().all(|t| t.stats.sqnr_db == f64::INFINITY));
            assert_eq!(q.dequantized, reference);
            assert_eq!(q.summary().sqnr_db, None);
        }
    }
}

#[test]
fn sqnr_orders_int8_over_int4_g32_over_int4_g128_on_every_tensor() {
    let reference = reference();
    let schemes = [Scheme::Int8, all_int4(32), all_int4(128)];
    let models: Vec<QuantizedModel> = schemes
        .iter()
        .map(|s| quantize_model(&reference, s, &QuantizeOptions::default()).expect("quantizes"))
        .collect();
    println!("{:<40} {:>10} {:>10} {:>10}   (SQNR dB, stories260K at FP16)", "tensor", "int8", "int4-g32", "int4-g128");
    for i in 0..models[0].tensors.len() {
        let [a, b, c] = [0, 1, 2].map(|m| models[m].tensors[i].stats.sqnr_db);
        let name = &models[0].tensors[i].name;
        println!("{name:<40} {a:>10.3} {b:>10.3} {c:>10.3}");
        assert!(a > b && b > c, "{name}: int8 {a}, int4-g32 {b}, int4-g128 {c}");
    }
    let [a, b, c] = [0, 1, 2].map(|m| models[m].summary().sqnr_db.expect("lossy"));
    println!("{:<40} {a:>10.3} {b:>10.3} {c:>10.3}", "(aggregate)");
    assert!(a > b && b > c);
}

#[test]
fn ggml_formats_fall_back_on_rows_they_cannot_block() {
    let reference = reference();
    let down: BTreeSet<String> = (0..LAYERS).map(|i| format!("model.layers.{i}.mlp.down_proj.weight")).collect();
    for ty in GgmlType::ALL {
        let q = quantize_model(&reference, &Scheme::Ggml(ty), &QuantizeOptions::default()).expect("quantizes");
        let fell: BTreeSet<String> = q.summary().fell_back.into_iter().collect();
        let expected: BTreeSet<String> = if ty.block_size() == 256 {
            // Every row is 64 or 172 long; neither is a multiple of 256.
            q.tensors.iter().map(|t| t.name.clone()).collect()
        } else {
            // 64 = 2·32 blocks; 172 = 5·32 + 12 does not block.
            down.clone()
        };
        assert_eq!(fell, expected, "{ty}");
        for t in &q.tensors {
            assert_eq!(t.matrix.fell_back(), fell.contains(&t.name));
            let report = t.report();
            assert_eq!(report.stored, t.matrix.stored_name());
            if down.contains(&t.name) {
                // 172 fits no block type: F16, exact on the FP16-representable reference.
                assert_eq!(report.stored, "f16", "{ty} {}", t.name);
                assert_eq!(t.matrix.bits_per_weight(), 16.0);
            } else if t.matrix.fell_back() {
                // 64-wide rows: Q4_K → Q5_0, Q6_K → Q8_0 (llama.cpp's fallbacks).
                let fallback = ty.row_fallback().expect("a K-quant");
                assert_eq!(report.stored, fallback.name(), "{ty} {}", t.name);
                assert!(t.stats.sqnr_db.is_finite());
            } else {
                assert_eq!(report.stored, ty.name());
                assert!(t.stats.sqnr_db.is_finite());
            }
        }
    }
    // The embedding (64 columns) blocks in 32s too.
    let opts = QuantizeOptions { quantize_embeddings: true, quantize_head: false, ..Default::default() };
    let q = quantize_model(&reference, &Scheme::Ggml(GgmlType::Q8_0), &opts).expect("quantizes");
    let emb = q.tensor(WeightSlot::TokenEmbedding).expect("quantized");
    assert!(!emb.matrix.fell_back());
    assert_eq!(emb.matrix.bits_per_weight(), 8.5);
}

#[test]
fn int4_g128_quantizes_short_last_groups_on_their_own() {
    let reference = reference();
    let q = quantize_model(&reference, &all_int4(128), &QuantizeOptions::default()).expect("quantizes");
    for t in &q.tensors {
        let [rows, cols] = t.shape;
        let scales = t.matrix.parts().into_iter().find(|p| p.name == "scales").expect("scales");
        assert_eq!(scales.shape, [rows, cols.div_ceil(128)], "{}", t.name);
    }
    for layer in 0..LAYERS {
        // w_down rows: 172 = 128 + 44. Each piece quantizes exactly as a matrix of its own.
        let w = linear(&reference, layer, "mlp.down_proj");
        let (rows, cols) = (w.shape[0], w.shape[1]);
        assert_eq!(cols, 172);
        let full = q.tensor(slot(layer, "mlp.down_proj")).expect("quantized").matrix.dequantize();
        let (head, tail): (Vec<f32>, Vec<f32>) = (
            w.data.chunks(cols).flat_map(|r| r[..128].to_vec()).collect(),
            w.data.chunks(cols).flat_map(|r| r[128..].to_vec()).collect(),
        );
        let head_q = quantize(&all_int4(128), &head, rows, 128).expect("q").dequantize();
        let tail_q = quantize(&all_int4(44), &tail, rows, 44).expect("q").dequantize();
        let joined: Vec<f32> =
            head_q.chunks(128).zip(tail_q.chunks(44)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect();
        assert_eq!(bits(&full), bits(&joined), "layer {layer}");
        // 64-column tensors hold one short group per row: the same as int4-g64.
        let wq = linear(&reference, layer, "self_attn.q_proj");
        let g64 = quantize(&all_int4(64), &wq.data, wq.shape[0], 64).expect("q");
        let g128 = &q.tensor(slot(layer, "self_attn.q_proj")).expect("q").matrix;
        assert_eq!(bits(&g128.dequantize()), bits(&g64.dequantize()));
    }
}

/// A mixture of experts' experts are quantized like any linear layer; its router stays at
/// reference precision unless `quantize_router`.
#[test]
fn experts_are_quantized_and_the_router_only_when_asked() {
    let model = qdrift_load::synthetic_model("moe-tiny", 3).expect("moe-tiny").model;
    let router = |m: &HostModel| m.layers[1].experts().expect("experts").router.clone();
    let expert_gate = |m: &HostModel| m.layers[1].experts().expect("experts").experts[5].gate.clone();
    let scheme = Scheme::Int8;
    let kept = quantize_model(&model, &scheme, &QuantizeOptions::default()).expect("quantizes");
    assert_eq!(router(&kept.dequantized), router(&model));
    assert_ne!(expert_gate(&kept.dequantized), expert_gate(&model));
    assert_eq!(kept.tensors.len(), 2 * (4 + 3 * 8));
    assert!(kept.tensors.iter().any(|t| t.name == "model.layers.1.mlp.experts.5.gate_proj.weight"));
    let opts = QuantizeOptions { quantize_router: true, ..Default::default() };
    let all = quantize_model(&model, &scheme, &opts).expect("quantizes");
    assert_ne!(router(&all.dequantized), router(&model));
    assert_eq!(all.tensors.len(), 2 * (4 + 3 * 8 + 1));
    assert!(all.tensors.iter().any(|t| t.name == "model.layers.1.mlp.gate.weight"));
}

#[test]
fn embedding_and_head_options() {
    let tied = reference();
    let scheme = all_int4(32);
    let default = quantize_model(&tied, &scheme, &QuantizeOptions::default()).expect("q");
    assert!(default.tensor(WeightSlot::TokenEmbedding).is_none());
    assert_eq!(bits(&default.dequantized.token_embedding.data), bits(&tied.token_embedding.data));

    // A tied head follows the embedding: quantize_head alone changes nothing.
    let head_only = QuantizeOptions { quantize_embeddings: false, quantize_head: true, ..Default::default() };
    let q = quantize_model(&tied, &scheme, &head_only).expect("q");
    assert_eq!(q.dequantized, default.dequantized);
    assert_eq!(q.tensors, default.tensors);
    assert!(q.dequantized.output.is_none());

    let emb = QuantizeOptions { quantize_embeddings: true, quantize_head: false, ..Default::default() };
    let q = quantize_model(&tied, &scheme, &emb).expect("q");
    let t = q.tensor(WeightSlot::TokenEmbedding).expect("embedding quantized");
    assert_eq!(t.name, "model.embed_tokens.weight");
    assert_eq!(t.shape, [512, 64]);
    assert_eq!(q.tensors.len(), LAYERS * 7 + 1);
    assert!(q.dequantized.output.is_none(), "stays tied");
    assert_eq!(bits(&q.dequantized.token_embedding.data), bits(&t.matrix.dequantize()));
    assert_ne!(q.dequantized.token_embedding.data, tied.token_embedding.data);
    // ...and with it the head, which is the same tensor.
    assert_eq!(bits(&q.dequantized.output_weight().data), bits(&t.matrix.dequantize()));

    // Untied: each option quantizes its own tensor only.
    let untied = untied(tied);
    let head_ref = untied.output.clone().expect("untied");
    let q = quantize_model(&untied, &scheme, &QuantizeOptions::default()).expect("q");
    assert_eq!(q.dequantized.output, Some(head_ref.clone()));
    assert_eq!(q.dequantized.token_embedding, untied.token_embedding);

    let q = quantize_model(&untied, &scheme, &head_only).expect("q");
    let h = q.tensor(WeightSlot::OutputHead).expect("head quantized");
    assert_eq!(h.name, "lm_head.weight");
    assert_eq!(q.tensors.last().map(|t| t.slot), Some(WeightSlot::OutputHead));
    assert!(q.tensor(WeightSlot::TokenEmbedding).is_none());
    assert_eq!(q.dequantized.token_embedding, untied.token_embedding);
    assert_eq!(bits(&q.dequantized.output_weight().data), bits(&h.matrix.dequantize()));

    let q = quantize_model(&untied, &scheme, &emb).expect("q");
    assert!(q.tensor(WeightSlot::OutputHead).is_none());
    assert!(q.tensor(WeightSlot::TokenEmbedding).is_some());
    assert_eq!(q.dequantized.output, Some(head_ref));
}

#[test]
fn bits_per_weight_totals_match_the_tensors() {
    let reference = untied(reference());
    let all = QuantizeOptions { quantize_embeddings: true, quantize_head: true, ..Default::default() };
    for scheme in Scheme::all() {
        let q = quantize_model(&reference, &scheme, &all).expect("q");
        let s = q.summary();
        let reports = q.reports();
        assert_eq!(s.scheme, scheme.to_string());
        assert_eq!(s.quantized_tensors, LAYERS * 7 + 2);
        let weights: usize = reports.iter().map(|r| r.shape.iter().product::<usize>()).sum();
        assert_eq!(s.quantized_weights, weights);
        assert_eq!(s.storage_bytes, reports.iter().map(|r| r.storage_bytes).sum::<usize>());
        assert_eq!(s.bits_per_weight, s.storage_bytes as f64 * 8.0 / weights as f64);
        // The total is the weight-averaged per-tensor bits.
        let averaged: f64 =
            reports.iter().map(|r| r.bits_per_weight * r.shape.iter().product::<usize>() as f64).sum::<f64>()
                / weights as f64;
        assert!((averaged - s.bits_per_weight).abs() < 1e-9, "{scheme}");
        for r in &reports {
            let n = r.shape.iter().product::<usize>() as f64;
            assert!((r.bits_per_weight - r.storage_bytes as f64 * 8.0 / n).abs() < 1e-12);
        }
        // The aggregate SQNR lies between the tensors' extremes.
        if let Some(total) = s.sqnr_db {
            let finite: Vec<f64> = reports.iter().filter_map(|r| r.sqnr_db).collect();
            let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(lo - 1e-9 <= total && total <= hi + 1e-9, "{scheme}: {lo} {total} {hi}");
        }
    }
    // Fixed-rate formats: known bits per weight.
    let bpw = |scheme: Scheme| quantize_model(&reference, &scheme, &all).expect("q").summary().bits_per_weight;
    assert_eq!(bpw(Scheme::Fp16), 16.0);
    assert_eq!(bpw(Scheme::Bf16), 16.0);
    assert!(bpw(Scheme::Ggml(GgmlType::Q4_0)) > 4.5); // 4.5, plus the f32 fall-backs
}

#[test]
fn every_codec_maps_an_all_zero_matrix_to_zeros() {
    // Why TensorReport::sqnr_db can use None for +inf only: −inf never happens.
    for scheme in Scheme::all() {
        let q = quantize(&scheme, &[0.0; 2 * 256], 2, 256).expect("q");
        assert!(q.dequantize().iter().all(|&v| v == 0.0), "{scheme}");
    }
}

// --- safetensors ---------------------------------------------------------------------------

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("written")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Puts rotate-half row `r` back at interleaved row `order[r]`.
fn unpermute<T: Copy + Default>(values: &[T], n_heads: usize, head_dim: usize) -> Vec<T> {
    let order = rotate_half_row_order(n_heads, head_dim);
    let cols = values.len() / order.len();
    let mut out = vec![T::default(); values.len()];
    for (r, &src) in order.iter().enumerate() {
        out[src * cols..(src + 1) * cols].copy_from_slice(&values[r * cols..(r + 1) * cols]);
    }
    out
}

/// Rows of an interleaved q/k matrix in rotate-half order.
fn permute(values: &[f32], n_heads: usize, head_dim: usize) -> Vec<f32> {
    let order = rotate_half_row_order(n_heads, head_dim);
    let cols = values.len() / order.len();
    order.iter().flat_map(|&r| values[r * cols..(r + 1) * cols].to_vec()).collect()
}

/// Every HF tensor name and its HostModel tensor (interleaved q/k).
fn hf_tensors(model: &HostModel) -> Vec<(String, &HostTensor)> {
    let mut out = vec![("model.embed_tokens.weight".to_owned(), &model.token_embedding)];
    for (i, layer) in model.layers.iter().enumerate() {
        out.push((format!("model.layers.{i}.input_layernorm.weight"), &layer.attn_norm));
        out.push((format!("model.layers.{i}.post_attention_layernorm.weight"), &layer.ffn_norm));
        for (short, t) in layer.linears() {
            out.push((format!("model.layers.{i}.{short}.weight"), t));
        }
    }
    out.push(("model.norm.weight".to_owned(), &model.final_norm));
    if let Some(head) = &model.output {
        out.push(("lm_head.weight".to_owned(), head));
    }
    out
}

/// `(n_heads, head_dim)` when `name` is a q or k projection.
fn rope_of(model: &HostModel, name: &str) -> Option<(usize, usize)> {
    let hd = model.arch.head_dim();
    if name.ends_with("q_proj.weight") {
        Some((model.arch.n_heads, hd))
    } else if name.ends_with("k_proj.weight") {
        Some((model.arch.n_kv_heads, hd))
    } else {
        None
    }
}

fn files_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect()
}

fn check_metadata(st: &[u8], scheme: Scheme, packed: bool, opts: QuantizeOptions) {
    let (_, meta) = SafeTensors::read_metadata(st).expect("header");
    let mut meta: HashMap<String, String> = meta.metadata().clone().expect("metadata");
    // A ggml scheme names the tensors it stored as another type (stories260K's 172-wide
    // down_proj rows fit no block of 32: F16).
    if let Some(fallback) = meta.remove("qdrift.fallback") {
        assert!(matches!(scheme, Scheme::Ggml(_)), "{scheme}: {fallback}");
        assert!(fallback.contains("model.layers.0.mlp.down_proj.weight=f16"), "{scheme}: {fallback}");
    } else {
        assert!(!matches!(scheme, Scheme::Ggml(_)), "{scheme}: no qdrift.fallback");
    }
    let expected: HashMap<String, String> = [
        ("format", "pt".to_owned()),
        ("qdrift.scheme", scheme.to_string()),
        ("qdrift.packed", packed.to_string()),
        ("qdrift.quantize_embeddings", opts.quantize_embeddings.to_string()),
        ("qdrift.quantize_head", opts.quantize_head.to_string()),
        ("qdrift.rope_layout", "rotate_half".to_owned()),
        ("qdrift.source", "stories260K.bin".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(meta, expected);
}

fn extra() -> Vec<(String, String)> {
    vec![("qdrift.source".to_owned(), "stories260K.bin".to_owned())]
}

#[test]
fn dequantized_safetensors_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (reference(), all_int4(32), QuantizeOptions::default()),
        (
            reference(),
            Scheme::Ggml(GgmlType::Q8_0),
            QuantizeOptions { quantize_embeddings: true, quantize_head: false, ..Default::default() },
        ),
        (
            untied(reference()),
            Scheme::Nf4 { block: 64 },
            QuantizeOptions { quantize_embeddings: false, quantize_head: true, ..Default::default() },
        ),
    ];
    for (i, (model, scheme, opts)) in cases.into_iter().enumerate() {
        let q = quantize_model(&model, &scheme, &opts).expect("q");
        let path = dir.path().join(format!("model-{i}.safetensors"));
        write_safetensors(&path, &q, false, &extra()).expect("written");
        let bytes = read(&path);
        check_metadata(&bytes, scheme, false, opts);
        let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let expected = hf_tensors(&q.dequantized);
        let names: BTreeSet<&str> = st.names().into_iter().collect();
        assert_eq!(names, expected.iter().map(|(n, _)| n.as_str()).collect::<BTreeSet<_>>());
        assert_eq!(names.contains("lm_head.weight"), model.output.is_some());
        for (name, t) in &expected {
            let view = st.tensor(name).expect("present");
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            assert_eq!(view.shape(), &t.shape[..], "{name}");
            let mut values = f32s(view.data());
            if let Some((heads, hd)) = rope_of(&q.dequantized, name) {
                assert_ne!(bits(&values), bits(&t.data), "{name} is permuted");
                values = unpermute(&values, heads, hd);
            }
            assert_eq!(bits(&values), bits(&t.data), "{name}");
        }
    }
    let left = files_in(dir.path());
    assert!(left.iter().all(|f| f.ends_with(".safetensors")), "{left:?}");
    assert_eq!(left.len(), 3);
}

#[test]
fn packed_safetensors_for_every_scheme() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reference = untied(reference());
    let opts = QuantizeOptions { quantize_embeddings: true, quantize_head: true, ..Default::default() };
    for scheme in Scheme::all() {
        let q = quantize_model(&reference, &scheme, &opts).expect("q");
        let path = dir.path().join(format!("{scheme}.safetensors"));
        write_safetensors(&path, &q, true, &extra()).expect("written");
        let bytes = read(&path);
        check_metadata(&bytes, scheme, true, opts);
        let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let mut expected_names = BTreeSet::new();
        for (name, t) in hf_tensors(&reference) {
            let Some(qt) = q.tensors.iter().find(|qt| qt.name == name) else {
                // Norms: F32 as in the reference.
                let view = st.tensor(&name).expect("present");
                assert_eq!((view.dtype(), view.shape()), (Dtype::F32, &t.shape[..]));
                assert_eq!(bits(&f32s(view.data())), bits(&t.data), "{name}");
                expected_names.insert(name);
                continue;
            };
            // Packed parts of q/k are exactly those of quantizing the rotate-half matrix.
            let parts: Vec<PackedPart> = match rope_of(&reference, &name) {
                Some((heads, hd)) => {
                    quantize(&scheme, &permute(&t.data, heads, hd), qt.shape[0], qt.shape[1]).expect("q").parts()
                }
                None => qt.matrix.parts(),
            };
            let base = name.strip_suffix(".weight").expect("weight name");
            for part in parts {
                let part_name = format!("{base}.{}", part.name);
                let view = st.tensor(&part_name).unwrap_or_else(|_| panic!("{part_name}"));
                assert_eq!(format!("{:?}", view.dtype()), part.dtype.safetensors_name(), "{part_name}");
                assert_eq!(view.shape(), &part.shape[..], "{part_name}");
                assert_eq!(view.data(), &part.bytes[..], "{part_name}");
                expected_names.insert(part_name);
            }
            // The dequantized rotate-half matrix, un-permuted, is the model's.
            if let Some((heads, hd)) = rope_of(&reference, &name) {
                let requant =
                    quantize(&scheme, &permute(&t.data, heads, hd), qt.shape[0], qt.shape[1]).expect("q").dequantize();
                let dq = &hf_tensors(&q.dequantized).into_iter().find(|(n, _)| *n == name).expect("present").1.data;
                assert_eq!(bits(&unpermute(&requant, heads, hd)), bits(dq), "{scheme} {name}");
            }
        }
        let names: BTreeSet<String> = st.names().into_iter().map(str::to_owned).collect();
        assert_eq!(names, expected_names, "{scheme}");
    }
    let left = files_in(dir.path());
    assert!(left.iter().all(|f| f.ends_with(".safetensors")), "{left:?}");
    assert_eq!(left.len(), Scheme::all().len());
}

#[test]
fn packed_tied_embedding_has_no_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = QuantizeOptions { quantize_embeddings: true, quantize_head: true, ..Default::default() };
    let scheme = Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: true };
    let q = quantize_model(&reference(), &scheme, &opts).expect("q");
    let path = dir.path().join("tied.safetensors");
    write_safetensors(&path, &q, true, &[]).expect("written");
    let bytes = read(&path);
    let st = SafeTensors::deserialize(&bytes).expect("valid");
    let names: BTreeSet<&str> = st.names().into_iter().collect();
    assert!(names.contains("model.embed_tokens.codes"));
    assert_eq!(st.tensor("model.embed_tokens.scales").expect("scale").shape(), [1]);
    assert!(!names.iter().any(|n| n.starts_with("lm_head")));
    assert!(!names.contains("model.embed_tokens.weight"));
}

#[test]
fn failed_writes_leave_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = quantize_model(&reference(), &Scheme::Int8, &QuantizeOptions::default()).expect("q");
    let path = dir.path().join("out.safetensors");

    // A key qdrift sets itself.
    let clash = vec![("qdrift.scheme".to_owned(), "other".to_owned())];
    let err = write_safetensors(&path, &q, false, &clash).expect_err("clash");
    assert!(matches!(&err, WriteError::MetadataKey { key, .. } if key == "qdrift.scheme"));
    assert!(err.to_string().contains("out.safetensors"), "{err}");

    // Renaming over a folder fails after the temporary file was written.
    std::fs::create_dir(&path).expect("mkdir");
    std::fs::write(path.join("keep"), b"x").expect("file");
    let err = write_safetensors(&path, &q, true, &[]).expect_err("a folder is in the way");
    assert!(matches!(err, WriteError::Io { .. }), "{err}");
    assert_eq!(files_in(dir.path()), BTreeSet::from(["out.safetensors".to_owned()]));
    std::fs::remove_dir_all(&path).expect("rm");

    // A folder that does not exist.
    let missing = dir.path().join("no/such/dir/out.safetensors");
    assert!(write_safetensors(&missing, &q, false, &[]).is_err());
    assert!(files_in(dir.path()).is_empty());

    // Overwriting an existing file replaces it whole.
    write_safetensors(&path, &q, false, &[]).expect("first");
    write_safetensors(&path, &q, true, &[]).expect("second");
    let bytes = read(&path);
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
    assert_eq!(meta.metadata().as_ref().and_then(|m| m.get("qdrift.packed")).map(String::as_str), Some("true"));
    assert_eq!(files_in(dir.path()), BTreeSet::from(["out.safetensors".to_owned()]));
}

#[test]
fn malformed_models_are_named_errors() {
    let mut model = reference();
    model.layers[2].wk.data.pop();
    let err = quantize_model(&model, &Scheme::Int8, &QuantizeOptions::default()).expect_err("bad");
    assert!(err.to_string().starts_with("model.layers.2.self_attn.k_proj.weight:"), "{err}");

    let mut model = reference();
    model.layers[1].mlp_mut().expect("dense").up.data[7] = f32::NAN;
    let err = quantize_model(&model, &Scheme::Int8, &QuantizeOptions::default()).expect_err("nan");
    assert!(err.to_string().starts_with("model.layers.1.mlp.up_proj.weight:"), "{err}");
}

#[test]
fn qwen2_biases_are_written_as_f32_with_q_k_in_rotate_half_order() {
    // stories260K given biases whose value is their row index: 8 query heads and 4 kv heads of
    // width 8.
    let mut model = reference();
    for layer in &mut model.layers {
        let rows = |n: usize| Some(HostTensor::new(vec![n], (0..n).map(|r| r as f32).collect()).expect("shape"));
        (layer.bq, layer.bk, layer.bv) = (rows(64), rows(32), rows(32));
    }
    let q = quantize_model(&model, &Scheme::Int8, &QuantizeOptions::default()).expect("q");
    assert_eq!(q.dequantized.layers[4].bq, model.layers[4].bq, "biases are not quantized");
    let dir = tempfile::tempdir().expect("tempdir");
    for packed in [false, true] {
        let path = dir.path().join(format!("biased-{packed}.safetensors"));
        write_safetensors(&path, &q, packed, &extra()).expect("written");
        let bytes = read(&path);
        let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
        for i in 0..LAYERS {
            let get = |short: &str| {
                let view = st.tensor(&format!("model.layers.{i}.self_attn.{short}.bias")).expect("bias written");
                assert_eq!(view.dtype(), Dtype::F32);
                f32s(view.data())
            };
            // Rotate-half row h·8 + a·4 + j holds interleaved row h·8 + 2j + a.
            let head: Vec<f32> = [0, 2, 4, 6, 1, 3, 5, 7].map(|r| r as f32).to_vec();
            let (bq, bk, bv) = (get("q_proj"), get("k_proj"), get("v_proj"));
            assert_eq!((bq.len(), bk.len()), (64, 32));
            assert_eq!(bq[..8], head[..], "layer {i} q bias");
            assert_eq!(bq[56..], head.iter().map(|r| r + 56.0).collect::<Vec<_>>()[..]);
            assert_eq!(bk[8..16], head.iter().map(|r| r + 8.0).collect::<Vec<_>>()[..]);
            assert_eq!(bv, (0..32).map(|r| r as f32).collect::<Vec<_>>(), "v is not permuted");
        }
    }
}
