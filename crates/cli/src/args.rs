//! Argument helpers that several commands share: `--model`'s help, `--batch-size`'s help and
//! `--dtype`'s parser. A leaf module: the command modules use it, it uses none of them.

use burn::tensor::DType;
use qdrift_generate::MAX_DEFAULT_BATCH_SIZE;
use qdrift_load::SYNTHETIC_PRESETS;

/// `--model`'s help: every format `open_model` reads, the synthetic presets by name.
pub fn model_help() -> String {
    let presets: Vec<&str> = SYNTHETIC_PRESETS.iter().map(|(name, _)| *name).collect();
    format!(
        "Model: a llama2.c checkpoint (.bin), a GGUF file, a Hugging Face folder, or synthetic:NAME ({})",
        presets.join(", ")
    )
}

/// `--batch-size`'s help for `generate` and `eval`, from [`qdrift_generate::default_batch_size`]'s cap.
pub fn batch_size_help() -> String {
    format!(
        "Prompts per batch (default: the prompts split evenly over the batches the device runs at once, one per core on the CPU backend and one on a GPU, at most {MAX_DEFAULT_BATCH_SIZE} per batch)"
    )
}

/// Parses `--dtype`.
pub fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        other => Err(format!("unknown dtype \"{other}\"; known: f32, f16")),
    }
}
