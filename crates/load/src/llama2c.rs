//! llama2.c "legacy" checkpoints (`run.c`'s `read_checkpoint`).
//!
//! Layout (all little-endian): seven `i32` header fields `dim, hidden_dim, n_layers, n_heads,
//! n_kv_heads, vocab_size, seq_len` — a negative `vocab_size` means the classifier is not tied to
//! the embedding — then `f32` tensors in this order: token embedding `[vocab, dim]`, attention
//! RMSNorm weights `[layers, dim]`, `wq [layers, dim, dim]`, `wk [layers, kv_dim, dim]`,
//! `wv [layers, kv_dim, dim]`, `wo [layers, dim, dim]`, FFN RMSNorm weights `[layers, dim]`,
//! `w1 [layers, hidden, dim]`, `w2 [layers, dim, hidden]`, `w3 [layers, hidden, dim]`, final
//! RMSNorm `[dim]`, two unused RoPE tables of `seq_len * head_dim / 2` floats each, and, when
//! untied, the classifier `[vocab, dim]`. Linear weights are `[out, in]` row-major and q/k use the
//! interleaved RoPE layout, which is exactly [`HostModel`]'s convention.

use std::path::{Path, PathBuf};

use crate::LoadError;
use crate::loaded::{LoadedModel, ModelFormat, check_vocab};
use crate::tokenizer::Llama2cTokenizer;
use qdrift_weights::{ArchShape, Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch};

const HEADER_BYTES: usize = 7 * 4;

/// Reads a llama2.c legacy checkpoint.
///
/// The file size must match the header exactly; a shorter file is reported as truncated, a
/// longer one as inconsistent with its header.
pub fn read_llama2c_checkpoint(path: &Path) -> Result<HostModel, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::MODEL)?;
    parse_llama2c(path, &bytes)
}

/// Header → expected file size → weights in file order → finiteness.
fn parse_llama2c(path: &Path, bytes: &[u8]) -> Result<HostModel, LoadError> {
    let arch = parse_header(path, bytes)?;
    check_file_size(path, &arch, bytes.len())?;
    let model = read_weights(arch, &bytes[HEADER_BYTES..]);
    check_finite(path, &model)?;
    Ok(model)
}

/// The seven header fields as a [`ModelArch`] (`run.c`'s defaults for what the header lacks:
/// RMSNorm epsilon 1e-5, RoPE theta 10000).
fn parse_header(path: &Path, bytes: &[u8]) -> Result<ModelArch, LoadError> {
    if bytes.len() < HEADER_BYTES {
        return Err(LoadError::truncated(path, format!("header needs {HEADER_BYTES} bytes, file has {}", bytes.len())));
    }
    let field = |i: usize| i32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]);
    let names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"];
    let mut header = [0usize; 7];
    for (i, name) in names.iter().enumerate() {
        let v = field(i);
        // A negative vocab_size marks an untied classifier.
        let v = if i == 5 { v.checked_abs().unwrap_or(0) } else { v };
        if v <= 0 {
            return Err(LoadError::invalid(
                path,
                format!("not a llama2.c checkpoint: header field {name} is {}", field(i)),
            ));
        }
        header[i] = v as usize;
    }
    let [dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len] = header;
    if n_heads > 0 && !dim.is_multiple_of(n_heads) {
        return Err(LoadError::invalid(
            path,
            format!("inconsistent header: dim {dim} is not a multiple of n_heads {n_heads}"),
        ));
    }
    let head_dim = dim.checked_div(n_heads).unwrap_or(0);
    let shape =
        ArchShape { dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, max_seq_len: seq_len };
    // `ModelArch::new`'s epsilon and theta are run.c's.
    let arch = ModelArch { tied_embeddings: field(5) > 0, ..ModelArch::new("llama", shape) };
    arch.validate().map_err(|m| LoadError::invalid(path, format!("inconsistent header: {m}")))?;
    Ok(arch)
}

/// Errors unless the file is exactly as long as the header says: shorter is truncated, longer
/// inconsistent with its header.
fn check_file_size(path: &Path, arch: &ModelArch, file_len: usize) -> Result<(), LoadError> {
    let (dim, hidden_dim, n_layers, vocab_size, seq_len) =
        (arch.dim, arch.hidden_dim, arch.n_layers, arch.vocab_size, arch.max_seq_len);
    let (head_dim, kv_dim) = (arch.head_dim(), arch.kv_dim());
    // Element counts in file order; checked arithmetic so that an absurd header cannot overflow.
    let mul = |a: usize, b: usize| a.checked_mul(b);
    let overflow = || LoadError::invalid(path, "header describes a model too large to address");
    let sizes = [
        ("token_embedding", mul(vocab_size, dim)),
        ("rms_att_weight", mul(n_layers, dim)),
        ("wq", mul(n_layers, dim).and_then(|x| mul(x, dim))),
        ("wk", mul(n_layers, kv_dim).and_then(|x| mul(x, dim))),
        ("wv", mul(n_layers, kv_dim).and_then(|x| mul(x, dim))),
        ("wo", mul(n_layers, dim).and_then(|x| mul(x, dim))),
        ("rms_ffn_weight", mul(n_layers, dim)),
        ("w1", mul(n_layers, hidden_dim).and_then(|x| mul(x, dim))),
        ("w2", mul(n_layers, dim).and_then(|x| mul(x, hidden_dim))),
        ("w3", mul(n_layers, hidden_dim).and_then(|x| mul(x, dim))),
        ("rms_final_weight", Some(dim)),
        ("freq_cis", mul(seq_len, head_dim)),
        ("wcls", if arch.tied_embeddings { Some(0) } else { mul(vocab_size, dim) }),
    ];
    let mut total = 0usize;
    for (_, n) in &sizes {
        total = n.and_then(|n| total.checked_add(n)).ok_or_else(overflow)?;
    }
    let expected = total.checked_mul(4).and_then(|t| t.checked_add(HEADER_BYTES)).ok_or_else(overflow)?;
    if file_len < expected {
        return Err(LoadError::truncated(
            path,
            format!(
                "header (dim {dim}, hidden {hidden_dim}, {n_layers} layers, {} heads, {} kv heads, vocab {vocab_size}, seq_len {seq_len}) needs {expected} bytes, file has {file_len}",
                arch.n_heads, arch.n_kv_heads
            ),
        ));
    }
    if file_len > expected {
        return Err(LoadError::invalid(
            path,
            format!(
                "header inconsistent with file size: header needs {expected} bytes, file has {file_len} ({} extra)",
                file_len - expected
            ),
        ));
    }
    Ok(())
}

/// The f32 tensors after the header (`body`, whose length [`check_file_size`] checked), split
/// per layer into [`HostModel`]'s layout.
fn read_weights(arch: ModelArch, body: &[u8]) -> HostModel {
    let (dim, hidden_dim, n_layers, vocab_size) = (arch.dim, arch.hidden_dim, arch.n_layers, arch.vocab_size);
    let (head_dim, kv_dim) = (arch.head_dim(), arch.kv_dim());
    let mut floats = body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let mut take = |n: usize| -> Vec<f32> { floats.by_ref().take(n).collect() };
    let t = |shape: Vec<usize>, data: Vec<f32>| HostTensor { shape, data };

    let token_embedding = t(vec![vocab_size, dim], take(vocab_size * dim));
    let rms_att = take(n_layers * dim);
    let wq = take(n_layers * dim * dim);
    let wk = take(n_layers * kv_dim * dim);
    let wv = take(n_layers * kv_dim * dim);
    let wo = take(n_layers * dim * dim);
    let rms_ffn = take(n_layers * dim);
    let w1 = take(n_layers * hidden_dim * dim);
    let w2 = take(n_layers * dim * hidden_dim);
    let w3 = take(n_layers * hidden_dim * dim);
    let final_norm = t(vec![dim], take(dim));
    let _freq_cis = take(arch.max_seq_len * head_dim);
    let output = (!arch.tied_embeddings).then(|| t(vec![vocab_size, dim], take(vocab_size * dim)));

    let layer = |all: &[f32], l: usize, rows: usize, cols: usize| {
        let n = rows * cols;
        HostTensor {
            shape: if cols == 1 { vec![rows] } else { vec![rows, cols] },
            data: all[l * n..(l + 1) * n].to_vec(),
        }
    };
    let layers = (0..n_layers)
        .map(|l| LayerWeights {
            attn_norm: layer(&rms_att, l, dim, 1),
            wq: layer(&wq, l, dim, dim),
            wk: layer(&wk, l, kv_dim, dim),
            wv: layer(&wv, l, kv_dim, dim),
            wo: layer(&wo, l, dim, dim),
            ffn_norm: layer(&rms_ffn, l, dim, 1),
            bq: None,
            bk: None,
            bv: None,
            ffn: Ffn::Dense(Mlp::new(
                layer(&w1, l, hidden_dim, dim),
                layer(&w3, l, hidden_dim, dim),
                layer(&w2, l, dim, hidden_dim),
            )),
            bo: None,
            q_norm: None,
            k_norm: None,
            sinks: None,
            post_attn_norm: None,
            post_ffn_norm: None,
        })
        .collect();
    HostModel { arch, token_embedding, layers, final_norm, output }
}

/// The first NaN or infinity of the model, named by llama2.c's field names.
fn check_finite(path: &Path, model: &HostModel) -> Result<(), LoadError> {
    let mut named: Vec<(String, &HostTensor)> = vec![("token_embedding".into(), &model.token_embedding)];
    for (i, l) in model.layers.iter().enumerate() {
        named.push((format!("layers.{i}.attn_norm"), &l.attn_norm));
        named.push((format!("layers.{i}.ffn_norm"), &l.ffn_norm));
        for (name, w) in l.linears() {
            named.push((format!("layers.{i}.{name}"), w));
        }
    }
    named.push(("final_norm".into(), &model.final_norm));
    if let Some(o) = &model.output {
        named.push(("output".into(), o));
    }
    named.iter().try_for_each(|(name, t)| crate::input::check_finite(path, name, &t.data))
}

/// A llama2.c checkpoint with llama2.c's `tokenizer.bin` (`tokenizer`, else `tokenizer.bin` in
/// the checkpoint's folder, else the only `tok*.bin` file there), for [`crate::open_model`].
pub(crate) fn open_llama2c(path: &Path, tokenizer: Option<&Path>) -> Result<LoadedModel, LoadError> {
    let model = read_llama2c_checkpoint(path)?;
    let tokenizer_path = match tokenizer {
        Some(t) => t.to_path_buf(),
        None => find_llama2c_tokenizer(path)?,
    };
    let tok = Llama2cTokenizer::read(&tokenizer_path)?;
    check_vocab(&tok, &tokenizer_path, &model.arch, path)?;
    let source_dtypes = llama2c_tensor_names(&model).into_iter().map(|n| (n, "F32".to_string())).collect();
    Ok(LoadedModel {
        model,
        tokenizer: Box::new(tok),
        path: path.to_path_buf(),
        tokenizer_path,
        format: ModelFormat::Llama2c,
        source_dtypes,
        source_storage: None,
        chat_template: None,
        quantization: None,
        notes: Vec::new(),
    })
}

/// Names for the tensors of a llama2.c checkpoint (which has none): llama2.c's field names.
fn llama2c_tensor_names(model: &HostModel) -> Vec<String> {
    let mut names = vec!["token_embedding_table".to_string()];
    for i in 0..model.layers.len() {
        for n in ["rms_att_weight", "wq", "wk", "wv", "wo", "rms_ffn_weight", "w1", "w3", "w2"] {
            names.push(format!("layers.{i}.{n}"));
        }
    }
    names.push("rms_final_weight".to_string());
    if model.output.is_some() {
        names.push("wcls".to_string());
    }
    names
}

fn find_llama2c_tokenizer(model: &Path) -> Result<PathBuf, LoadError> {
    let dir = model.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let standard = dir.join("tokenizer.bin");
    if standard.is_file() {
        return Ok(standard);
    }
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::io(dir, e))?;
    let mut candidates: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tok") && n.ends_with(".bin")))
        .collect();
    candidates.sort();
    match candidates.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LoadError::invalid(
            model,
            format!(
                "no tokenizer given and no tokenizer.bin or tok*.bin beside it in {}; pass --tokenizer",
                dir.display()
            ),
        )),
        many => Err(LoadError::invalid(
            model,
            format!(
                "no tokenizer given and {} candidates beside it ({}); pass --tokenizer",
                many.len(),
                many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fields: [i32; 7]) -> Vec<u8> {
        fields.iter().flat_map(|f| f.to_le_bytes()).collect()
    }

    /// A tiny valid checkpoint: dim 4, hidden 6, 1 layer, 2 heads, 1 kv head, vocab 5, seq 3.
    fn tiny(tied: bool) -> Vec<u8> {
        let vocab = if tied { 5 } else { -5 };
        let mut b = header([4, 6, 1, 2, 1, vocab, 3]);
        let kv = 2;
        let n = 5 * 4 + 4 + 16 + kv * 4 * 2 + 16 + 4 + 3 * 24 + 4 + 3 * 2 + if tied { 0 } else { 20 };
        b.extend((0..n).flat_map(|i| (i as f32 * 0.01f32).to_le_bytes()));
        b
    }

    #[test]
    fn reads_a_tiny_checkpoint_in_file_order() {
        let m = parse_llama2c(Path::new("t.bin"), &tiny(true)).expect("valid");
        assert_eq!(m.arch.kv_dim(), 2);
        assert!(m.output.is_none());
        assert_eq!(m.token_embedding.data[0], 0.0);
        // attention norm follows the 20 embedding floats.
        assert_eq!(m.layers[0].attn_norm.data[0], 20.0 * 0.01);
        assert_eq!(m.layers[0].wq.shape, vec![4, 4]);
        assert_eq!(m.layers[0].wk.shape, vec![2, 4]);
        assert_eq!(m.layers[0].mlp().expect("dense").down.shape, vec![4, 6]);
        let u = parse_llama2c(Path::new("t.bin"), &tiny(false)).expect("valid");
        assert_eq!(u.output.as_ref().map(|o| o.shape.clone()), Some(vec![5, 4]));
    }

    #[test]
    fn truncated_and_oversized_files_are_errors() {
        let b = tiny(true);
        let e = parse_llama2c(Path::new("t.bin"), &b[..b.len() - 4]).unwrap_err().to_string();
        assert!(e.contains("t.bin: truncated"), "{e}");
        let e = parse_llama2c(Path::new("t.bin"), &b[..10]).unwrap_err().to_string();
        assert!(e.contains("header needs 28 bytes"), "{e}");
        let mut longer = b.clone();
        longer.extend([0u8; 8]);
        let e = parse_llama2c(Path::new("t.bin"), &longer).unwrap_err().to_string();
        assert!(e.contains("inconsistent with file size"), "{e}");
    }

    #[test]
    fn absurd_headers_are_errors_not_panics() {
        for fields in [
            [0, 6, 1, 2, 1, 5, 3],
            [4, 6, 1, 3, 1, 5, 3],
            [4, 6, 1, 2, 3, 5, 3],
            [i32::MAX, i32::MAX, i32::MAX, 1, 1, i32::MIN, i32::MAX],
            [4, 6, -1, 2, 1, 5, 3],
        ] {
            let mut b = header(fields);
            b.extend([0u8; 64]);
            let e = parse_llama2c(Path::new("x.bin"), &b).unwrap_err().to_string();
            assert!(e.starts_with("x.bin"), "{e}");
        }
    }

    #[test]
    fn non_finite_weights_are_named() {
        let mut b = tiny(true);
        let at = HEADER_BYTES + 4 * 21; // second attention-norm weight
        b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        let e = parse_llama2c(Path::new("t.bin"), &b).unwrap_err().to_string();
        assert!(e.contains("layers.0.attn_norm"), "{e}");
    }
}
