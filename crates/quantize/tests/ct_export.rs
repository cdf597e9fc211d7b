//! `write_compressed_tensors` (what `qdrift quantize --scheme nvfp4 --packed` writes): the FP4
//! schemes as compressed-tensors folders, read back by qdrift's own reader
//! (`qdrift_load::hf::quant`, `fp4.rs`) equal to the scheme's dequantized weights bit for bit.
//!
//! The model is stories260K with its FFN cut to 160 of its 172 hidden units, so that every row
//! is whole FP4 groups (compressed-tensors refuses others), written as a Hugging Face folder at
//! FP16 by `qdrift_load::write::write_hf_folder`: the source whose `config.json` and tokenizer
//! the export carries over. With `QDRIFT_CT_EXPORT=DIR` the test also leaves, for
//! `ct_py/check_export.py` (compressed-tensors' own reading), `DIR/<scheme>/` and
//! `DIR/<scheme>.safetensors` (the dequantized weights as qdrift writes them, F32), and the
//! source folder `DIR/source`.

use std::path::{Path, PathBuf};

use qdrift_load::write::{WriteDtype, write_hf_folder};
use qdrift_load::{HostModel, HostTensor, Llama2cTokenizer, open_model, read_llama2c_checkpoint};
use qdrift_quantize::{
    Mxfp4Rule, QuantizeOptions, QuantizedModel, Scheme, WriteError, quantize_model, round_to_fp16_reference,
    write_compressed_tensors, write_safetensors,
};

fn stories() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("models/stories260K")
}

/// The first `n` rows (`rows: true`) or columns of a matrix.
fn cut(t: &HostTensor, n: usize, rows: bool) -> HostTensor {
    let (r, c) = (t.shape[0], t.shape[1]);
    let (nr, nc) = if rows { (n, c) } else { (r, n) };
    let data = (0..nr).flat_map(|i| t.data[i * c..i * c + nc].iter().copied()).collect();
    HostTensor::new(vec![nr, nc], data).expect("shape")
}

/// stories260K at FP16 with a 160-wide FFN, and its tokenizer.
fn model() -> (HostModel, Llama2cTokenizer) {
    let dir = stories();
    let mut m = read_llama2c_checkpoint(&dir.join("stories260K.bin")).expect("stories260K");
    const HIDDEN: usize = 160;
    m.arch.hidden_dim = HIDDEN;
    for layer in &mut m.layers {
        let mlp = layer.mlp_mut().expect("dense FFN");
        mlp.gate = cut(&mlp.gate, HIDDEN, true);
        mlp.up = cut(&mlp.up, HIDDEN, true);
        mlp.down = cut(&mlp.down, HIDDEN, false);
    }
    round_to_fp16_reference(&mut m);
    (m, Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tok512"))
}

/// The first tensor whose weights differ (bit patterns) between two models.
fn first_difference(a: &HostModel, b: &HostModel) -> Option<String> {
    let mut b_tensors = Vec::new();
    b.clone().for_each_tensor_mut(|t| b_tensors.push(t.clone()));
    let (mut i, mut diff) = (0, None);
    a.clone().for_each_tensor_mut(|t| {
        let o = &b_tensors[i];
        if diff.is_none() {
            if t.shape != o.shape {
                diff = Some(format!("tensor #{i}: shape {:?} vs {:?}", t.shape, o.shape));
            } else if let Some(k) = t.data.iter().zip(&o.data).position(|(x, y)| x.to_bits() != y.to_bits()) {
                diff = Some(format!("tensor #{i}, index {k}: {} vs {}", t.data[k], o.data[k]));
            }
        }
        i += 1;
    });
    diff.or_else(|| (i != b_tensors.len()).then(|| format!("{i} vs {} tensors", b_tensors.len())))
}

fn quantized(m: &HostModel, scheme: Scheme) -> QuantizedModel {
    quantize_model(m, &scheme, &QuantizeOptions::default()).expect("quantizes")
}

#[test]
fn fp4_folders_read_back_as_the_schemes_dequantized_weights() {
    let (m, tok) = model();
    let tmp = tempfile::tempdir().expect("tempdir");
    let keep = std::env::var_os("QDRIFT_CT_EXPORT").map(PathBuf::from);
    let source = keep.as_deref().unwrap_or(tmp.path()).join("source");
    write_hf_folder(&source, &m, &tok, WriteDtype::F16).expect("source folder");
    let schemes = [
        (Scheme::Nvfp4, "nvfp4-pack-quantized fp4 group 16"),
        (Scheme::Mxfp4 { rule: Mxfp4Rule::CompressedTensors }, "mxfp4-pack-quantized fp4 group 32"),
        (Scheme::Mxfp4 { rule: Mxfp4Rule::Ocp }, "mxfp4-pack-quantized fp4 group 32"),
    ];
    for (scheme, weights) in schemes {
        let q = quantized(&m, scheme);
        assert_eq!(q.tensors.len(), 5 * 7, "{scheme}: every linear layer");
        let out = keep.as_deref().unwrap_or(tmp.path()).join(scheme.to_string());
        write_compressed_tensors(&out, &q, &source).expect("written");
        for carried in ["tokenizer.json", "tokenizer_config.json"] {
            assert!(out.join(carried).is_file(), "{scheme}: {carried}");
        }
        let loaded = open_model(&out, None).unwrap_or_else(|e| panic!("{scheme}: {e}"));
        if let Some(diff) = first_difference(&loaded.model, &q.dequantized) {
            panic!("{scheme}: read-back weights differ from the scheme's: {diff}");
        }
        let read = loaded.quantization.expect("quantization reported");
        assert!(read.weights.contains(weights), "{scheme}: {}", read.weights);
        assert_eq!(read.activations, None);
        if let Some(dir) = &keep {
            write_safetensors(&dir.join(format!("{scheme}.safetensors")), &q, false, &[]).expect("F32 file");
        }
    }
}

#[test]
fn what_compressed_tensors_cannot_hold_is_refused_by_name() {
    let (m, tok) = model();
    let tmp = tempfile::tempdir().expect("tempdir");
    let source = tmp.path().join("source");
    write_hf_folder(&source, &m, &tok, WriteDtype::F16).expect("source folder");
    let out = tmp.path().join("out");
    let e = write_compressed_tensors(&out, &quantized(&m, Scheme::Int8), &source).unwrap_err();
    assert!(e.to_string().contains("written for nvfp4, mxfp4-ct and mxfp4-ocp"), "{e}");
    // The source must be a Hugging Face folder (its config.json is carried over).
    let e =
        write_compressed_tensors(&out, &quantized(&m, Scheme::Nvfp4), &stories().join("stories260K.bin")).unwrap_err();
    assert!(e.to_string().contains("from a Hugging Face folder"), "{e}");
    // stories260K's own 172-wide FFN is not whole groups of 16.
    let mut full = read_llama2c_checkpoint(&stories().join("stories260K.bin")).expect("stories260K");
    round_to_fp16_reference(&mut full);
    match write_compressed_tensors(&out, &quantized(&full, Scheme::Nvfp4), &source) {
        Err(WriteError::Layout { tensor, message, .. }) => {
            assert_eq!(tensor, "model.layers.0.mlp.down_proj.weight");
            assert_eq!(message, "172 inputs per row are not whole nvfp4 groups of 16");
        }
        other => panic!("{other:?}"),
    }
    // A tensor the Llama-layout writer does not write (Qwen3's q/k norms) is refused.
    let mut qwen3 = m.clone();
    qwen3.layers[0].q_norm = HostTensor::new(vec![8], vec![1.0; 8]);
    let e = write_compressed_tensors(&out, &quantized(&qwen3, Scheme::Nvfp4), &source).unwrap_err();
    assert!(e.to_string().contains("does not write yet"), "{e}");
    let opts = QuantizeOptions { quantize_embeddings: true, ..QuantizeOptions::default() };
    let q = quantize_model(&m, &Scheme::Nvfp4, &opts).expect("quantizes");
    let e = write_compressed_tensors(&out, &q, &source).unwrap_err();
    assert!(e.to_string().contains("--quantize-embeddings"), "{e}");
    assert!(!out.exists(), "nothing written");
}
