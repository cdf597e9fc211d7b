//! Argument helpers that several commands share: `--model`'s help, `--batch-size`'s help,
//! `--dtype`'s parser, and the parsers of variants (`--scheme`, `--schemes`). A leaf module: the
//! command modules use it, it uses none of them.

use burn::tensor::DType;
use clap::builder::{PossibleValue, TypedValueParser};
use qdrift_generate::{BackendChoice, MAX_DEFAULT_BATCH_SIZE};
use qdrift_load::SYNTHETIC_PRESETS;
use qdrift_quantize::{Recipe, Scheme};

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

/// Parses `--dtype`; `--help` lists its values.
pub fn dtype_parser() -> impl TypedValueParser<Value = DType> {
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("f16").help("half precision (weights rounded to f16; norms and softmax in f32)"),
        PossibleValue::new("bf16").help(
            "bfloat16, as checkpoints are published and served (weights rounded to bf16, f32 accumulation, every op's output rounded to bf16 as in PyTorch; CPU backend only)",
        ),
        PossibleValue::new("f32").help("single precision"),
    ])
    .map(|s| match s.as_str() {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => DType::F32,
    })
}

/// Parses `--backend`; `--help` lists its values.
pub fn backend_parser() -> impl TypedValueParser<Value = BackendChoice> {
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("auto").help("wgpu on a hardware GPU adapter if there is one, else the CPU"),
        PossibleValue::new("wgpu").help("wgpu on the best adapter, even a software one (Mesa's lavapipe)"),
        PossibleValue::new("cpu").help("Burn's CPU backend"),
    ])
    // The names are BackendChoice's own (its FromStr); the list only adds their help to --help.
    .try_map(|s| s.parse::<BackendChoice>())
}

/// Every weight scheme of [`Scheme::all`] with its sentence ([`Scheme::describe`]) and the W8A8
/// shorthands, for `--help`.
pub fn recipe_possible_values() -> Box<dyn Iterator<Item = PossibleValue>> {
    let schemes = Scheme::all().into_iter().map(|s| PossibleValue::new(s.to_string()).help(s.describe()));
    let shorthands = Recipe::shorthands().map(|r| {
        let help = format!("= {}+a-{}", r.weights, r.activations.map(|a| a.to_string()).unwrap_or_default());
        PossibleValue::new(r.to_string()).help(help)
    });
    Box::new(schemes.chain(shorthands))
}

/// Parses one variant (`WEIGHTS[+a-ACT][+kv-KV]`, [`Recipe`]) of flag `arg`.
pub fn parse_recipe(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &std::ffi::OsStr,
) -> Result<Recipe, clap::Error> {
    recipe_entry(cmd, arg, value, utf8(cmd, arg, value)?)
}

/// `value` as text, or clap's error for a value that is not UTF-8.
fn utf8<'v>(cmd: &clap::Command, arg: Option<&clap::Arg>, value: &'v std::ffi::OsStr) -> Result<&'v str, clap::Error> {
    value.to_str().ok_or_else(|| invalid_value(cmd, arg, value, "not UTF-8".to_string()))
}

/// `entry` (all of `value`, or one comma-separated part of it) as a [`Recipe`]; a refusal quotes
/// the whole `value`.
fn recipe_entry(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &std::ffi::OsStr,
    entry: &str,
) -> Result<Recipe, clap::Error> {
    entry.parse::<Recipe>().map_err(|e| invalid_value(cmd, arg, value, e.to_string()))
}

/// clap's error for an invalid `value` of flag `arg`, the value quoted short ([`qdrift_io::elide`]:
/// a 100 KB value is not echoed whole).
fn invalid_value(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &std::ffi::OsStr,
    problem: String,
) -> clap::Error {
    let flag = arg.and_then(clap::Arg::get_long).map_or_else(|| "the value".to_string(), |l| format!("--{l}"));
    let message = format!("invalid value '{}' for '{flag}': {problem}\n", qdrift_io::elide(&value.to_string_lossy()));
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd)
}

/// One `--schemes` value: comma-separated variants (`int8,fp8-e4m3`); the empty string is none at
/// all (`--schemes ''`: only the `--variant` checkpoints run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemeList(pub Vec<Recipe>);

/// Parses a `--schemes` value into a [`SchemeList`]; an entry that is not a variant is refused,
/// the value quoted short ([`qdrift_io::elide`]); `--help` lists [`recipe_possible_values`].
#[derive(Clone, Copy)]
pub struct SchemeListParser;

impl TypedValueParser for SchemeListParser {
    type Value = SchemeList;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<SchemeList, clap::Error> {
        let text = utf8(cmd, arg, value)?;
        if text.is_empty() {
            return Ok(SchemeList::default());
        }
        text.split(',').map(|e| recipe_entry(cmd, arg, value, e)).collect::<Result<_, _>>().map(SchemeList)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(recipe_possible_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<SchemeList, String> {
        let cmd = clap::Command::new("qdrift");
        SchemeListParser.parse_ref(&cmd, None, std::ffi::OsStr::new(s)).map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_scheme_list_is_no_scheme_and_entries_parse_as_recipes() {
        assert_eq!(parse(""), Ok(SchemeList(Vec::new())));
        let two = parse("int8,fp8-e4m3+kv-q8_0").expect("parses");
        assert_eq!(two.0.len(), 2);
        assert_eq!(two.0[1].to_string(), "fp8-e4m3+kv-q8_0");
        let e = parse("int8,").unwrap_err();
        assert!(e.contains("the weight scheme is missing"), "{e}");
    }

    #[test]
    fn a_long_bad_list_is_quoted_short() {
        let long = format!("int8,{}", "z".repeat(100_000));
        let e = parse(&long).unwrap_err();
        assert!(e.len() < 4000, "{} bytes", e.len());
        assert!(e.contains("…(100005 bytes)…"), "{e}");
    }
}
