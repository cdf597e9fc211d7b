//! `qdrift quantize` and `qdrift generate --scheme` on stories260K.

use std::collections::HashMap;
use std::path::Path;

mod common;
use common::{qdrift, stories};
use qdrift_quantize::Scheme;

/// Per-tensor SQNR (dB; `f64::INFINITY` for exact) printed by `qdrift quantize --json`.
fn sqnr(scheme: &str, dir: &Path) -> HashMap<String, f64> {
    let model = stories().join("stories260K.bin");
    let out_file = dir.join(format!("{scheme}.safetensors"));
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        scheme,
        "--out",
        out_file.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{scheme}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out_file.is_file(), "{scheme}: no output file");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["scheme"], scheme);
    v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| (t["tensor"].as_str().unwrap().to_string(), t["sqnr_db"].as_f64().unwrap_or(f64::INFINITY)))
        .collect()
}

#[test]
fn every_scheme_quantizes_stories260k_and_int8_beats_int4() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut all = HashMap::new();
    // The names themselves are pinned by `crates/codecs/tests/schemes.rs`; here every one of
    // them must work through the binary.
    for scheme in Scheme::all().iter().map(ToString::to_string) {
        let s = sqnr(&scheme, tmp.path());
        assert_eq!(s.len(), 35, "{scheme}: 5 layers × 7 linear weights");
        assert!(s.values().all(|v| !v.is_nan()), "{scheme}: NaN SQNR");
        all.insert(scheme, s);
    }
    for (tensor, int8) in &all["int8"] {
        let (g32, g128) = (all["int4-g32"][tensor], all["int4-g128"][tensor]);
        println!("{tensor:<42} int8 {int8:7.3} int4-g32 {g32:7.3} int4-g128 {g128:7.3}");
        assert!(*int8 > g32 && g32 > g128, "{tensor}: int8 {int8} > int4-g32 {g32} > int4-g128 {g128} fails");
    }
    assert!(all["fp16"].values().all(|v| v.is_infinite()), "fp16 on an FP16 reference is exact");
}

#[test]
fn table_output_names_fallbacks_and_bits() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    let out_file = tmp.path().join("q.safetensors");
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "q8_0",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("model.layers.0.self_attn.q_proj.weight"), "{stdout}");
    assert!(stdout.contains("8.5000"), "q8_0 is 8.5 bits/weight: {stdout}");
    assert!(
        stdout.contains("stored as llama.cpp's fallback type: model.layers.0.mlp.down_proj.weight (f16)"),
        "{stdout}"
    );
}

/// One bits-per-weight figure: a GGUF that `quantize` writes gets the same figure from `quantize`
/// (its `file:` line), `inspect` and `eval --variant` (report.json), and `eval --schemes` reports
/// the `model:` line's for the scheme (the norms at FP16, not F32 as the file stores them).
#[test]
fn a_written_gguf_has_one_bits_per_weight_everywhere() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = stories();
    let (model, tok) = (dir.join("stories260K.bin"), dir.join("tok512.bin"));
    let gguf = tmp.path().join("stories-q8_0.gguf");
    let q = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--scheme",
        "q8_0",
        "--format",
        "gguf",
        "--out",
        gguf.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&q.stdout).into_owned();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let figure = |prefix: &str| -> f64 {
        let line = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}: {stdout}"));
        let before = line.split(" bits/weight").next().expect("a figure");
        before.rsplit(' ').next().expect("a number").parse().expect("a number")
    };
    let (scheme_bits, file_bits) = (figure("model: "), figure("file: "));
    // Its 704 norm weights are F32 in the file, FP16 in the scheme's figure.
    assert!((file_bits - scheme_bits - 704.0 * 16.0 / 260_032.0).abs() < 1e-4, "{scheme_bits} {file_bits}");
    let inspect = qdrift(&["inspect", "--model", gguf.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains(&format!("source storage: {file_bits:.2} bits/weight")), "{text}");
    let out = tmp.path().join("eval");
    let e = qdrift(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--variant",
        gguf.to_str().unwrap(),
        "--schemes",
        "q8_0",
        "--prompts",
        "2",
        "--horizons",
        "4",
        "--resamples",
        "50",
        "--backend",
        "cpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report")).expect("JSON");
    let bits = |name: &str| -> f64 {
        let v = report["variants"].as_array().unwrap().iter().find(|v| v["name"] == name).expect("variant");
        v["bits_per_weight"].as_f64().expect("bits")
    };
    assert!((bits("stories-q8_0") - file_bits).abs() < 5e-5, "{} vs {file_bits}", bits("stories-q8_0"));
    assert!((bits("q8_0") - scheme_bits).abs() < 5e-5, "{} vs {scheme_bits}", bits("q8_0"));
}

#[test]
fn unknown_scheme_lists_the_known_ones() {
    let model = stories().join("stories260K.bin");
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "int3",
        "--out",
        "/tmp/never.safetensors",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("unknown weight scheme `int3` (did you mean int8?); a variant is WEIGHTS[+a-ACT][+kv-KV]; WEIGHTS: fp16, bf16, int8"),
        "{stderr}"
    );
    assert!(!Path::new("/tmp/never.safetensors").exists());
}

#[test]
fn generate_runs_a_quantized_variant() {
    let model = stories().join("stories260K.bin");
    let run = |scheme: &str| {
        let out = qdrift(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "40",
            "--backend",
            "cpu",
            "--dtype",
            "f16",
            "--scheme",
            scheme,
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(v["scheme"], scheme);
        v["generated_tokens"].clone()
    };
    let fp16 = run("fp16");
    // Same FP16 reference weights with and without the identity scheme: identical tokens.
    let plain = qdrift(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "40",
        "--backend",
        "cpu",
        "--dtype",
        "f16",
        "--json",
    ]);
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).expect("JSON");
    assert_eq!(plain["generated_tokens"], fp16);
    let q4 = run("int4-g32");
    assert_eq!(q4.as_array().map(Vec::len), Some(40));
}

/// `qdrift generate --json`'s generated tokens for `model` (with `extra` flags), 40 tokens.
fn greedy(model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args =
        vec!["generate", "--model", model.to_str().unwrap(), "--prompt", "Once upon a time", "--max-new-tokens", "40"];
    args.extend(["--backend", "cpu", "--json"]);
    args.extend(extra);
    let out = qdrift(&args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["generated_tokens"].as_array().map(Vec::len), Some(40));
    v["generated_tokens"].clone()
}

/// Runs `qdrift quantize … --format gguf` and returns its stdout.
fn quantize_gguf(model: &Path, scheme: &str, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["quantize", "--model", model.to_str().unwrap(), "--scheme", scheme];
    args.extend(["--format", "gguf", "--out", out.to_str().unwrap()]);
    args.extend(extra);
    let run = qdrift(&args);
    assert!(run.status.success(), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
    assert!(out.is_file());
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn a_gguf_export_runs_exactly_what_generate_scheme_runs() {
    // The GGUF holds the variant's packed blocks; read back, it is the dequantized variant bit for
    // bit (crates/quantize/tests/gguf_out.rs), so its greedy tokens equal `generate --scheme`.
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    for (scheme, extra) in [("q4_k", &[][..]), ("q8_0", &["--quantize-embeddings"][..]), ("q6_k", &[][..])] {
        let gguf = tmp.path().join(format!("{scheme}.gguf"));
        let stdout = quantize_gguf(&model, scheme, &gguf, extra);
        assert!(stdout.contains(&format!("wrote {}", gguf.display())), "{stdout}");
        let mut with_scheme = vec!["--scheme", scheme];
        with_scheme.extend(extra);
        for dtype in ["f32", "f16"] {
            let from_gguf = greedy(&gguf, &["--dtype", dtype]);
            let mut flags = with_scheme.clone();
            flags.extend(["--dtype", dtype]);
            assert_eq!(from_gguf, greedy(&model, &flags), "{scheme} {dtype}");
        }
    }
    // stories260K's rows (64, 172) are not whole 256-blocks: q4_k stores q5_0 and F16, as
    // llama.cpp would, and says so.
    let stdout = quantize_gguf(&model, "q4_k", &tmp.path().join("again.gguf"), &[]);
    assert!(stdout.contains("model.layers.0.self_attn.q_proj.weight (q5_0)"), "{stdout}");
    assert!(stdout.contains("model.layers.0.mlp.down_proj.weight (f16)"), "{stdout}");
}

#[test]
fn a_hugging_face_folder_exports_to_gguf_with_its_tokenizer_converted() {
    // stories260K as a Hugging Face folder (tokenizer.json: SentencePiece-style BPE with byte
    // fallback): the GGUF carries the converted vocabulary (tokenizer.ggml.model = llama), so it
    // tokenizes the prompt as the folder does and generates what `--scheme q8_0` on the folder
    // generates; and as the llama2.c source's GGUF export does.
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    let hf = tmp.path().join("hf");
    let loaded = qdrift_load::open_model(&model, None).expect("stories260K");
    let tok = qdrift_load::Llama2cTokenizer::read(&stories().join("tok512.bin")).expect("tokenizer");
    qdrift_load::write::write_hf_folder(&hf, &loaded.model, &tok, qdrift_load::write::WriteDtype::F32).expect("HF");
    let gguf = tmp.path().join("hf-q8_0.gguf");
    let stdout = quantize_gguf(&hf, "q8_0", &gguf, &[]);
    assert!(stdout.contains(&format!("wrote {}", gguf.display())), "{stdout}");
    let meta = qdrift_load::read_gguf_metadata(&gguf).expect("GGUF metadata");
    assert_eq!(meta["tokenizer.ggml.model"].as_str(), Some("llama"));
    assert_eq!(meta["tokenizer.ggml.add_bos_token"].as_bool(), Some(true));
    let from_gguf = greedy(&gguf, &[]);
    assert_eq!(from_gguf, greedy(&hf, &["--scheme", "q8_0"]));
    let from_llama2c = tmp.path().join("llama2c-q8_0.gguf");
    quantize_gguf(&model, "q8_0", &from_llama2c, &[]);
    assert_eq!(from_gguf, greedy(&from_llama2c, &[]));
}

#[test]
fn quantize_reads_every_format_generate_reads() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    // A GGUF source (here qdrift's own FP16 export): its tokenizer keys are carried over, and a
    // q4_k of it runs as `generate --scheme q4_k` on it does.
    let fp16 = tmp.path().join("fp16.gguf");
    quantize_gguf(&model, "fp16", &fp16, &[]);
    assert_eq!(greedy(&fp16, &[]), greedy(&model, &["--scheme", "fp16"]));
    let q4k = tmp.path().join("q4_k.gguf");
    quantize_gguf(&fp16, "q4_k", &q4k, &[]);
    assert_eq!(greedy(&q4k, &[]), greedy(&fp16, &["--scheme", "q4_k"]));
    // Safetensors from a GGUF source and from a synthetic model.
    for source in [fp16.to_str().unwrap(), "synthetic:tiny"] {
        let out_file = tmp.path().join("x.safetensors");
        let out = qdrift(&["quantize", "--model", source, "--scheme", "q8_0", "--out", out_file.to_str().unwrap()]);
        assert!(out.status.success(), "{source}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let synthetic = tmp.path().join("tiny.gguf");
    quantize_gguf(Path::new("synthetic:tiny"), "q4_0", &synthetic, &[]);
    assert_eq!(greedy(&synthetic, &[]), greedy(Path::new("synthetic:tiny"), &["--scheme", "q4_0"]));
}

/// Exactly one line on stderr, exit code 2 (unusable input), no output file.
fn refused(args: &[&str], out: &Path) -> String {
    let run = qdrift(args);
    assert_eq!(run.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(run.stdout.is_empty());
    assert!(!out.exists(), "{args:?} wrote {}", out.display());
    stderr
}

#[test]
fn gguf_export_refuses_what_gguf_cannot_hold() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    let out = tmp.path().join("x.gguf");
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    for scheme in ["int4-g128", "nf4-g64", "fp8-e4m3", "bf16", "int8"] {
        let stderr = refused(&["quantize", "--model", m, "--scheme", scheme, "--format", "gguf", "--out", o], &out);
        assert_eq!(
            stderr.trim_end(),
            format!(
                "qdrift: error: --scheme {scheme} cannot be written as GGUF: GGUF stores ggml types; schemes it can \
                 hold: fp16, q8_0, q4_0, q4_1, q5_0, q4_k, q6_k, mxfp4"
            )
        );
    }
    let stderr =
        refused(&["quantize", "--model", m, "--scheme", "q4_0", "--format", "gguf", "--packed", "--out", o], &out);
    assert!(stderr.contains("--packed is for --format safetensors"), "{stderr}");
    // An unwritable --out: one line, before the model is read, nothing left beside it.
    let nowhere = tmp.path().join("missing/x.gguf");
    let n = nowhere.to_str().unwrap();
    let stderr = refused(&["quantize", "--model", m, "--scheme", "q4_0", "--format", "gguf", "--out", n], &nowhere);
    assert!(stderr.contains("--out") && stderr.contains("missing/x.gguf: its folder"), "{stderr}");
    assert!(stderr.trim_end().ends_with("missing does not exist"), "{stderr}");
    // A Hugging Face folder whose tokenizer.json is not a BPE that qdrift converts to GGUF's
    // vocabulary: one line naming the file and the field.
    let hf = tmp.path().join("hf");
    let loaded = qdrift_load::open_model(&model, None).expect("stories260K");
    let tok = qdrift_load::Llama2cTokenizer::read(&stories().join("tok512.bin")).expect("tokenizer");
    qdrift_load::write::write_hf_folder(&hf, &loaded.model, &tok, qdrift_load::write::WriteDtype::F16).expect("HF");
    let pieces: Vec<serde_json::Value> = (0..512)
        .map(|i| serde_json::json!([if i == 0 { "<unk>".to_string() } else { format!("p{i}") }, -1.0]))
        .collect();
    let unigram = serde_json::json!({"model": {"type": "Unigram", "unk_id": 0, "vocab": pieces}});
    std::fs::write(hf.join("tokenizer.json"), serde_json::to_vec(&unigram).unwrap()).unwrap();
    let h = hf.to_str().unwrap();
    let stderr = refused(&["quantize", "--model", h, "--scheme", "q4_0", "--format", "gguf", "--out", o], &out);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "qdrift: error: {}: model.type = Unigram is not supported; supported: BPE (byte-level as GPT-2, SmolLM2, \
             Llama 3, Qwen2; or SentencePiece-style with byte_fallback as Llama 2)",
            hf.join("tokenizer.json").display()
        )
    );
    // The same folder to safetensors is fine.
    let st = tmp.path().join("hf.safetensors");
    let run = qdrift(&["quantize", "--model", h, "--scheme", "q4_k", "--out", st.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}
