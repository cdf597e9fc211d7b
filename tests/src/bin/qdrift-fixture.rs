//! `qdrift-fixture`: writes a synthetic model as a Hugging Face folder (`config.json`,
//! `model.safetensors`, `tokenizer.json`) or as a GGUF file, for benchmarks that read a real
//! checkpoint at a real size (`cargo xtask bench scale`).
//!
//! ```text
//! qdrift-fixture NAME OUT [f32|f16|bf16]
//! ```
//! `NAME` is a `synthetic:` preset (`llama-1b`, ...); `OUT` a folder, or a `.gguf` file. The
//! weights are written in the dtype given (default bf16, as most checkpoints are published; GGUF
//! takes f32 or f16) with the preset's byte-level tokenizer. The whole model is gathered in f32
//! first: 4 bytes per parameter of host memory.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{byte_tokenizer, synthetic_model};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdrift-fixture: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, dir, dtype) = match args.as_slice() {
        [name, dir] => (name, dir, "bf16"),
        [name, dir, dtype] => (name, dir, dtype.as_str()),
        _ => return Err("usage: qdrift-fixture NAME OUT [f32|f16|bf16]".into()),
    };
    let dtype = match dtype {
        "f32" => WriteDtype::F32,
        "f16" => WriteDtype::F16,
        "bf16" => WriteDtype::BF16,
        other => return Err(format!("unknown dtype {other}; known: f32, f16, bf16")),
    };
    let loaded = synthetic_model(name, 0).map_err(|e| e.to_string())?;
    let tokenizer = byte_tokenizer(loaded.model.arch.vocab_size)?;
    let dir = PathBuf::from(dir);
    if dir.extension().is_some_and(|e| e == "gguf") {
        write_gguf(&dir, &loaded.model, &tokenizer, dtype).map_err(|e| e.to_string())?;
    } else {
        write_hf_folder(&dir, &loaded.model, &tokenizer, dtype).map_err(|e| e.to_string())?;
    }
    println!("wrote synthetic:{name} to {}", dir.display());
    Ok(())
}
