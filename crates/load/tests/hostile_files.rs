//! Hostile model files (issue #13): sizes that overflow, inputs that never end, weights that are
//! not numbers, and GGUF files llama.cpp would refuse. Each case asserts an error naming the file
//! and the problem, never a panic, a hang or a huge allocation.
//!
//! Fixtures: the synthetic `tiny` model (vocab 320, dim 32, hidden 64, 2 layers, 4/2 heads,
//! tied) written by `qdrift_load::write`, then edited byte by byte.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use qdrift_load::inspect::{Fp32, inspect_path};
use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{HostModel, LoadError, byte_tokenizer, open_model, read_gguf, synthetic_model};
use serde_json::Value;

fn tiny() -> HostModel {
    synthetic_model("tiny", 3).expect("tiny").model
}

/// `model` written as `m.gguf` (F32) in a fresh folder.
fn gguf_of(model: &HostModel) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    write_gguf(&path, model, &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    (dir, path)
}

/// `model` written as a Hugging Face folder (F32).
fn folder_of(model: &HostModel) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf_folder(dir.path(), model, &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    dir
}

/// Offset just past the length-prefixed string `s` (a metadata key or a tensor name).
fn after_str(bytes: &[u8], s: &str) -> usize {
    let mut key = (s.len() as u64).to_le_bytes().to_vec();
    key.extend(s.as_bytes());
    bytes.windows(key.len()).position(|w| w == key).unwrap_or_else(|| panic!("{s} not in file")) + key.len()
}

/// Offsets of the fields of tensor `name`'s info: `(first dim, type, data offset)`.
fn info_fields(bytes: &[u8], name: &str) -> (usize, usize, usize) {
    let at = after_str(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
    let ty = at + 4 + 8 * n_dims;
    (at + 4, ty, ty + 4)
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"))
}

fn put(bytes: &mut [u8], at: usize, v: &[u8]) {
    bytes[at..at + v.len()].copy_from_slice(v);
}

/// Rewrites the file with `edit` and returns `open_model`'s error.
fn gguf_error(edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let (_dir, path) = gguf_of(&tiny());
    let mut bytes = std::fs::read(&path).expect("read");
    edit(&mut bytes);
    std::fs::write(&path, &bytes).expect("write");
    let e = open_model(&path, None).err().expect("refused").to_string();
    assert!(e.starts_with(&path.display().to_string()), "names the file: {e}");
    e
}

/// A GGUF of `tiny` whose `llama.context_length` is the u64 `context`: the writer stores a u32,
/// so the value is widened in place and `general.name` shortened by the 4 bytes it gains, which
/// keeps every later byte where it was.
fn gguf_with_context(context: u64) -> (tempfile::TempDir, PathBuf) {
    let mut m = tiny();
    m.arch.architecture = "name-9999".into(); // general.name, 4 bytes to give back
    let (dir, path) = gguf_of(&m);
    let bytes = std::fs::read(&path).expect("read");
    let name = after_str(&bytes, "general.name") + 4; // past the value type
    let ctx = after_str(&bytes, "llama.context_length");
    let mut out = bytes[..name].to_vec();
    out.extend(5u64.to_le_bytes());
    out.extend(b"name-");
    out.extend(&bytes[name + 8 + 9..ctx]);
    out.extend(10u32.to_le_bytes()); // UINT64
    out.extend(context.to_le_bytes());
    out.extend(&bytes[ctx + 8..]);
    assert_eq!(out.len(), bytes.len());
    std::fs::write(&path, out).expect("write");
    (dir, path)
}

#[test]
fn a_context_length_of_2_pow_62_overflows_into_an_error_naming_the_file() {
    let (_dir, path) = gguf_with_context(1 << 62);
    let loaded = open_model(&path, None).expect("the file itself is valid");
    assert_eq!(loaded.model.arch.max_seq_len, 1 << 62);
    let e = inspect_path(&path, None, None, 1, &[&Fp32]).expect_err("overflows");
    assert!(matches!(e, LoadError::Overflow { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: KV-cache bytes does not fit in 64 bits (seq_len 4611686018427387904 (the model's context length), \
             batch 1)",
            path.display()
        )
    );
}

#[test]
fn a_huge_seq_len_and_batch_overflow_into_an_error() {
    let (_dir, path) = gguf_of(&tiny());
    let e = inspect_path(&path, None, Some(1 << 62), 1_000_000, &[&Fp32]).expect_err("overflows").to_string();
    assert!(e.contains("KV-cache bytes does not fit in 64 bits (seq_len 4611686018427387904 (as asked)"), "{e}");
    let e = inspect_path(Path::new("synthetic:tiny"), None, Some(usize::MAX), usize::MAX, &[]).expect_err("overflows");
    assert!(matches!(e, LoadError::Overflow { .. }), "{e}");
}

#[test]
fn config_json_context_of_2_pow_62_overflows_into_an_error() {
    let mut m = tiny();
    m.arch.max_seq_len = 1 << 62;
    let dir = folder_of(&m);
    let e = inspect_path(dir.path(), None, None, 1, &[&Fp32]).expect_err("overflows").to_string();
    assert!(e.starts_with(&dir.path().display().to_string()), "{e}");
    assert!(e.contains("KV-cache bytes does not fit in 64 bits"), "{e}");
}

#[test]
fn an_absurd_num_hidden_layers_is_refused_before_allocating() {
    for layers in [1u64 << 40, 1 << 62, u64::MAX] {
        let dir = folder_of(&tiny());
        let config = dir.path().join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("json");
        c["num_hidden_layers"] = layers.into();
        std::fs::write(&config, c.to_string()).expect("write");
        let e = open_model(dir.path(), None).err().expect("refused").to_string();
        assert!(e.starts_with(&config.display().to_string()), "{e}");
        assert!(e.contains(&format!("num_hidden_layers {layers} needs at least 9 tensors per layer")), "{e}");
    }
}

/// `mkfifo path` (std has no mkfifo; the program is POSIX).
fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().expect("mkfifo runs").success();
    assert!(ok, "mkfifo {}", path.display());
}

/// Runs `f`, asserting it returns within a second (a FIFO opened for reading would block).
fn quickly<T>(f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
    out
}

#[test]
fn devices_and_named_pipes_are_refused_unopened() {
    let e = quickly(|| open_model(Path::new("/dev/zero"), None)).err().expect("refused").to_string();
    assert_eq!(e, "/dev/zero: the model is a character device, not a regular file");
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["m.gguf", "m.bin"] {
        let fifo = dir.path().join(name);
        mkfifo(&fifo);
        let e = quickly(|| open_model(&fifo, None)).err().expect("refused").to_string();
        assert!(e.ends_with(&format!("{name}: the model is a named pipe (FIFO), not a regular file")), "{e}");
    }
    let e = quickly(|| read_gguf(&dir.path().join("m.gguf"))).expect_err("refused").to_string();
    assert!(e.contains("is a named pipe (FIFO)"), "{e}");
}

#[test]
fn hf_files_that_are_pipes_or_devices_are_refused_by_name() {
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        let dir = folder_of(&tiny());
        let p = dir.path().join(file);
        std::fs::remove_file(&p).ok();
        mkfifo(&p);
        let e = quickly(|| open_model(dir.path(), None)).err().expect("refused").to_string();
        let what = match file {
            "model.safetensors" => "model",
            "tokenizer.json" => "tokenizer",
            _ => "JSON file",
        };
        assert!(e.contains(&format!("{file}: the {what} is a named pipe (FIFO), not a regular file")), "{file}: {e}");
    }
    let dir = folder_of(&tiny());
    let e = quickly(|| open_model(dir.path(), Some(Path::new("/dev/zero")))).err().expect("refused").to_string();
    assert!(e.starts_with("/dev/zero: the tokenizer is a character device"), "{e}");
}

#[test]
fn an_oversized_config_json_is_refused_before_reading() {
    let dir = folder_of(&tiny());
    // Sparse: 1 GiB of length, no blocks written; only its length is looked at.
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("config.json")).expect("open");
    f.set_len(1 << 30).expect("set_len");
    let e = quickly(|| open_model(dir.path(), None)).err().expect("refused").to_string();
    assert!(e.contains("config.json: the JSON file is larger than its limit (more than 67108864 bytes)"), "{e}");
}

#[test]
fn a_nan_in_a_gguf_weight_is_named_with_its_flat_index() {
    let mut m = tiny();
    m.layers[1].mlp_mut().expect("dense").up.data[5] = f32::NAN;
    let (_dir, path) = gguf_of(&m);
    let e = open_model(&path, None).err().expect("refused").to_string();
    assert_eq!(
        e,
        format!("{}: tensor blk.1.ffn_up.weight has a non-finite value (NaN) at flat index 5", path.display())
    );
}

#[test]
fn an_infinity_in_a_safetensors_weight_is_named_with_its_flat_index() {
    let mut m = tiny();
    m.token_embedding.data[4100] = f32::NEG_INFINITY;
    let dir = folder_of(&m);
    let e = open_model(dir.path(), None).err().expect("refused").to_string();
    assert_eq!(
        e,
        format!(
            "{}: tensor model.embed_tokens.weight has a non-finite value (-inf) at flat index 4100",
            dir.path().join("model.safetensors").display()
        )
    );
}

#[test]
fn gguf_duplicate_metadata_key_is_refused() {
    // `llama.context_length` and `general.architecture` have the same length: rename one.
    let e = gguf_error(|b| {
        let at = after_str(b, "llama.context_length") - 20;
        put(b, at, b"general.architecture");
    });
    assert!(e.ends_with("metadata key general.architecture appears more than once"), "{e}");
}

#[test]
fn gguf_duplicate_tensor_name_is_refused() {
    let e = gguf_error(|b| {
        let at = after_str(b, "blk.0.attn_k.weight") - 19;
        put(b, at, b"blk.0.attn_q.weight");
    });
    assert!(e.ends_with("tensor blk.0.attn_q.weight appears more than once"), "{e}");
}

#[test]
fn gguf_misaligned_tensor_offset_is_refused() {
    let e = gguf_error(|b| {
        let (_, _, off) = info_fields(b, "blk.0.ffn_norm.weight");
        let v = get_u64(b, off) + 4;
        put(b, off, &v.to_le_bytes());
    });
    assert!(e.contains("tensor blk.0.ffn_norm.weight: data offset"), "{e}");
    assert!(e.ends_with("is not a multiple of general.alignment 32"), "{e}");
}

#[test]
fn gguf_overlapping_tensors_are_refused_naming_both() {
    let e = gguf_error(|b| {
        let (_, _, q) = info_fields(b, "blk.0.attn_q.weight");
        let (_, _, k) = info_fields(b, "blk.0.attn_k.weight");
        let v = get_u64(b, q);
        put(b, k, &v.to_le_bytes());
    });
    assert!(e.contains("overlap tensor blk.0.attn_"), "{e}");
    assert!(e.contains("blk.0.attn_q.weight") && e.contains("blk.0.attn_k.weight"), "{e}");
}

#[test]
fn gguf_tensors_out_of_order_are_refused_as_llama_cpp_does() {
    // Two [dim] F32 norms swap places: no overlap, aligned, but not in the order of their infos.
    let e = gguf_error(|b| {
        let (_, _, a) = info_fields(b, "blk.0.attn_norm.weight");
        let (_, _, f) = info_fields(b, "blk.0.ffn_norm.weight");
        let (va, vf) = (get_u64(b, a), get_u64(b, f));
        put(b, a, &vf.to_le_bytes());
        put(b, f, &va.to_le_bytes());
    });
    assert!(e.contains("tensor blk.0.attn_norm.weight: data offset"), "{e}");
    assert!(e.contains("stored in the order of their infos"), "{e}");
}

#[test]
fn gguf_zero_and_negative_dims_are_refused() {
    for (dim, shown) in [(0u64, "dimension 0"), (1 << 63, "dimension 9223372036854775808")] {
        let e = gguf_error(|b| {
            let (d, _, _) = info_fields(b, "output_norm.weight");
            put(b, d, &dim.to_le_bytes());
        });
        assert!(e.contains(&format!("tensor output_norm.weight: {shown} in")), "{e}");
    }
}

#[test]
fn gguf_bad_alignment_is_refused() {
    for a in [0u32, 24] {
        let e = gguf_error(|b| {
            let at = after_str(b, "general.alignment") + 4;
            put(b, at, &a.to_le_bytes());
        });
        assert!(e.ends_with(&format!("general.alignment is U32({a}); it must be a u32 non-zero power of two")), "{e}");
    }
}

/// A metadata array of 2^24 + 1 one-byte values (17 MB on disk, 537 MB as parsed values) is
/// refused before its values are held.
#[test]
fn metadata_past_2_pow_24_values_is_refused_before_it_is_held() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.gguf");
    let n: u64 = (1 << 24) + 1;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes()); // version
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    b.extend(1u64.to_le_bytes());
    b.extend(b"x");
    b.extend(9u32.to_le_bytes()); // ARRAY
    b.extend(0u32.to_le_bytes()); // of UINT8
    b.extend(n.to_le_bytes());
    b.resize(b.len() + n as usize, 7);
    std::fs::write(&path, &b).expect("write");
    let e = quickly(|| open_model(&path, None).err().expect("refused").to_string());
    assert!(e.contains("big.gguf") && e.contains("16777217 values") && e.contains("past 16777216 values"), "{e}");
}

/// A per-pair RoPE divisor in `rope_freqs.weight` that is a positive f32 but makes its pair's
/// inverse frequency infinite is refused naming the tensor and the element.
#[test]
fn gguf_rope_frequency_factors_that_overflow_are_refused() {
    let mut m = tiny();
    m.arch.rope_scaling = Some(qdrift_load::RopeScaling::FreqFactors { factors: vec![1.0, 1e-44, 1.0, 1.0] });
    let (_dir, path) = gguf_of(&m);
    let e = read_gguf(&path).expect_err("refused").to_string();
    let want = "rope_freqs.weight[1] (with llama.rope.scaling.factor) 1e-44 makes pair 1's RoPE inverse frequency inf";
    assert!(e.starts_with(&format!("{}: tensor {want}", path.display())), "{e}");
}

/// A `llama` file whose `llama.block_count` says 1 while it stores 2 blocks: the dense reader
/// read block 0 and ignored block 1; the first tensor of block 1 is refused.
#[test]
fn gguf_blocks_past_the_block_count_are_refused() {
    let e = gguf_error(|b| {
        let at = after_str(b, "llama.block_count") + 4; // past the value type
        put(b, at, &1u32.to_le_bytes());
    });
    assert!(
        e.contains(": tensor blk.1.")
            && e.ends_with("is in block 1, but llama.block_count is 1; qdrift would run without it"),
        "{e}"
    );
}
