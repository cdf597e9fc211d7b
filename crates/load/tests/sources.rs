//! A Hugging Face folder or a GGUF file opened as a source (`open_source`: each part read from
//! the mapped files when asked, nothing held) hands out the model `open_model` reads whole, part
//! for part, with the same stored sizes, dtypes and quantization summary; and a checkpoint
//! `open_model` refuses is refused at open, with the same error, however late in the file its
//! fault lies.

use std::path::{Path, PathBuf};

use qdrift_load::write::{WriteDtype, hf_tokenizer_keys, write_gguf_with};
use qdrift_load::{Ffn, HostModel, LoadedModel, WeightSource, open_model, open_source};

fn folders() -> Vec<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tiny = ["qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "mixtral", "gpt_oss"]
        .map(|a| manifest.join("../../../shared/models/tiny-arch").join(a));
    let quantized =
        ["gptq_v1_4bit_desc_act", "gptq_v2_8bit_asym", "awq_gemm", "ct_pack_int4_asym", "ct_fp8_channel", "fp8_block"]
            .map(|q| manifest.join("tests/hf_quant_py").join(q));
    tiny.into_iter().chain(quantized).collect()
}

fn not_called(_: &mut HostModel) {
    panic!("a Hugging Face folder's parts are not prepared whole");
}

fn describe(l: &LoadedModel<impl Sized>) -> String {
    format!("{:?} {:?} {:?}", l.source_dtypes, l.source_storage, l.quantization)
}

/// The tiny-arch folders as GGUF files (F16, their tokenizers converted as `qdrift quantize
/// --format gguf` converts them), written to `dir`; gemma2's untied head is not writable (its
/// llama.cpp loader always ties it), so gemma2 is left out.
fn gguf_files(dir: &Path) -> Vec<PathBuf> {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/tiny-arch");
    ["qwen3", "qwen3_moe", "gemma3", "phi3", "mixtral", "gpt_oss"]
        .iter()
        .map(|arch| {
            let src = tiny.join(arch);
            let model = open_model(&src, None).unwrap_or_else(|e| panic!("{arch}: {e}")).model;
            let keys = hf_tokenizer_keys(&src, &src.join("tokenizer.json"), model.arch.vocab_size).expect("keys");
            let path = dir.join(format!("{arch}.gguf"));
            write_gguf_with(&path, &model, &keys, WriteDtype::F16, &|_| None).unwrap_or_else(|e| panic!("{arch}: {e}"));
            path
        })
        .collect()
}

#[test]
fn a_checkpoint_read_part_by_part_is_the_checkpoint_read_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // SmolLM2-135M-Instruct's Q4_1 file, when `cargo xtask` has fetched it.
    let smollm2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let real = smollm2.exists().then_some(smollm2);
    for dir in folders().into_iter().chain(gguf_files(tmp.path())).chain(real) {
        let whole = open_model(&dir, None).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let source = open_source(&dir, None, &not_called).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(source.model.parameter_count(), whole.model.parameter_count(), "{}", dir.display());
        assert_eq!(source.model.arch(), &whole.model.arch, "{}", dir.display());
        let gathered = HostModel::from_source(&*source.model).expect("every part");
        assert!(gathered == whole.model, "{}: the parts differ from the whole read", dir.display());
        assert_eq!(source.format, whole.format);
        assert_eq!(describe(&source), describe(&whole), "{}", dir.display());
        assert_eq!(source.tokenizer.vocab_size(), whole.tokenizer.vocab_size());
        // A part asked for again is the same values.
        let last = whole.model.arch.n_layers - 1;
        assert!(source.model.layer(last).expect("last block") == whole.model.layers[last]);
        assert!(source.model.layer(last + 1).is_err(), "no block past the last");
    }
}

/// A NaN in the last tensor of the last block of a Hugging Face folder: both ways of opening
/// refuse the folder when it is opened, with the same one-line error.
#[test]
fn a_fault_in_the_last_block_is_refused_at_open() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/tiny-arch/qwen3");
    let tmp = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(&src).expect("qwen3 folder") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, tmp.path().join(path.file_name().expect("name"))).expect("copy");
    }
    let weights = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(&weights).expect("weights");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
    let layers = open_model(&src, None).expect("qwen3").model.arch.n_layers;
    let name = format!("model.layers.{}.mlp.down_proj.weight", layers - 1);
    let begin = header[&name]["data_offsets"][0].as_u64().expect("offset") as usize;
    assert_eq!(header[&name]["dtype"], "BF16");
    // A bf16 quiet NaN, little-endian.
    bytes[8 + header_len + begin..8 + header_len + begin + 2].copy_from_slice(&0x7FC0u16.to_le_bytes());
    std::fs::write(&weights, &bytes).expect("write");
    let whole = open_model(tmp.path(), None).err().expect("refused whole").to_string();
    let source = open_source(tmp.path(), None, &not_called).err().expect("refused as a source").to_string();
    assert_eq!(source, whole);
    assert!(whole.contains(&name) && !whole.contains('\n'), "{whole}");
}

/// The same in a GGUF file: a NaN written into its last block's `ffn_down` (F16), refused at
/// open.
#[test]
fn a_fault_in_a_gguf_files_last_block_is_refused_at_open() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/tiny-arch/qwen3");
    let mut model = open_model(&src, None).expect("qwen3").model;
    let keys = hf_tokenizer_keys(&src, &src.join("tokenizer.json"), model.arch.vocab_size).expect("keys");
    let last = model.arch.n_layers - 1;
    let Ffn::Dense(mlp) = &mut model.layers[last].ffn else { panic!("qwen3 is dense") };
    mlp.down.data[5] = f32::NAN;
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("qwen3.gguf");
    write_gguf_with(&path, &model, &keys, WriteDtype::F16, &|_| None).expect("written");
    let whole = open_model(&path, None).err().expect("refused whole").to_string();
    let source = open_source(&path, None, &not_called).err().expect("refused as a source").to_string();
    assert_eq!(source, whole);
    assert!(whole.contains(&format!("blk.{last}.ffn_down.weight")) && !whole.contains('\n'), "{whole}");
}
