//! **compressed-tensors** (`quant_method: compressed-tensors`): the config, unpacking on load and
//! packing for fixtures, side by side.
//!
//! Following `compressed_tensors/compressors/quantized_compressors/pack_quantized.py`
//! (`pack_to_int32`, `unpack_from_int32`), `naive_quantized.py`, `float_quantized.py` and
//! `compressed_tensors/quantization/lifecycle/forward.py` (`dequantize`). `config_groups.*` give
//! `targets` (`Linear`, a module name, or `re:` patterns), `weights` (`num_bits`, `type` int or
//! float, `symmetric`, `strategy` tensor / channel / group (`group_size`) / block
//! (`block_structure`)) and `input_activations`; `ignore` lists modules left unquantized.
//! Scales `weight_scale`: `[1]` (tensor), `[out, 1]` (channel), `[out, ⌈in/G⌉]` (group, the last
//! group shorter when G does not divide `in`), `[⌈out/bh⌉, ⌈in/bw⌉]` (block).
//! - `pack-quantized`: int4/int8 codes `q ∈ [−2^(b−1), 2^(b−1))` stored as `q + 2^(b−1)`, `pf = 32/b`
//!   per I32 of `weight_packed` `[out, ⌈in/pf⌉]` along the input, element `j` of a word at bits
//!   `b·j` (low bits first), the last word zero-padded; `weight_shape` `[out, in]`; asymmetric
//!   zero points `weight_zero_point` I32 packed the same way along dimension 0 (`[⌈out/pf⌉,
//!   groups]`); optional act-order `weight_g_idx` `[in]`.
//! - `int-quantized` / `naive-quantized`: I8 `weight` `[out, in]` holding `q`, optional
//!   `weight_zero_point` in the scale's shape.
//! - `float-quantized`: `weight` F8_E4M3 (or F8_E5M2) `[out, in]`, `w = fp8 · s`.
//! - `nvfp4-pack-quantized` (FP4 weights, `tensor_group` strategy, groups of 16, a global scale)
//!   and `mxfp4-pack-quantized` (FP4, E8M0 scales per 32): unpacked in `fp4.rs`.
//!
//! `input_activations` with `dynamic: true`, symmetric, int8 or FP8, per `token`, per `tensor`
//! or per token and `group` (`group_size` G; llm-compressor's `FP8_BLOCK` preset), becomes
//! [`crate::CheckpointQuant::activations`] (`qdrift eval` rounds a checkpoint variant's linear
//! inputs with it); static activation scales, asymmetric activations and other strategies are
//! refused, as are `output_activations`, a `kv_cache_scheme` and sparsity. FP4 input activations
//! (`num_bits: 4`, `type: float`, W4A4) are read in the two forms of compressed-tensors 0.20.1's
//! presets (`quantization/quant_scheme.py`): `NVFP4` (`strategy: tensor_group`, `group_size: 16`,
//! `dynamic: "local"`: E4M3 block scales computed at run time under a static per-layer
//! `input_global_scale` F32 tensor, read by `mod.rs`) and `MXFP4` (`strategy: group`,
//! `group_size: 32`, `dynamic: true`).

use std::path::Path;

use serde_json::{Value, json};

use super::fields::Fields;
use super::fp4::{self, Fp4Codes, Fp4Kind};
use super::packing::{Fp8Codes, HfDtype, HfTensor, IntCodes, Strategy, field, group_index, put};
use crate::LoadError;
use crate::hf::shards::Shards;
use crate::loaded::{ActivationFormat, ActivationGranularity, CheckpointActivations};

/// A compressed-tensors `quantization_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    /// `config_groups`, in file order.
    pub groups: Vec<CtGroup>,
    /// `ignore`: modules (names or `re:` patterns) left unquantized.
    pub ignore: Vec<String>,
}

/// One of `config_groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtGroup {
    /// `targets`: `Linear`, module names or `re:` patterns.
    pub targets: Vec<String>,
    /// How the targets are stored.
    pub scheme: CtScheme,
}

/// How a config group stores its linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtScheme {
    /// The group's `format`, else the config's.
    pub format: CtFormat,
    /// `weights`.
    pub weights: CtWeights,
    /// `input_activations` (symmetric; dynamic 8-bit, or FP4).
    pub activations: Option<CtActivations>,
}

/// compressed-tensors' storage formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtFormat {
    /// `pack-quantized`: int4/int8 codes packed in I32 words.
    Packed,
    /// `int-quantized` (or `naive-quantized`): I8 codes.
    Int,
    /// `float-quantized`: FP8 codes.
    Float,
    /// `nvfp4-pack-quantized`: E2M1 codes two per byte, E4M3 scales per 16, a global scale.
    Nvfp4,
    /// `mxfp4-pack-quantized`: E2M1 codes two per byte, E8M0 scales per 32.
    Mxfp4,
}

impl CtFormat {
    /// The FP4 layout of an FP4 format.
    fn fp4(self) -> Option<Fp4Kind> {
        match self {
            CtFormat::Nvfp4 => Some(Fp4Kind::Nvfp4),
            CtFormat::Mxfp4 => Some(Fp4Kind::Mxfp4),
            CtFormat::Packed | CtFormat::Int | CtFormat::Float => None,
        }
    }
}

/// A group's `weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtWeights {
    /// `num_bits`.
    pub bits: u32,
    /// `type: float` (FP8); else `int`.
    pub float: bool,
    /// `symmetric`.
    pub symmetric: bool,
    /// `strategy` (with `group_size` or `block_structure`).
    pub strategy: Strategy,
}

/// A group's symmetric `input_activations`: dynamic 8-bit, or FP4 (W4A4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtActivations {
    /// `num_bits`: 8, or 4 (FP4: NVFP4 when `granularity` is per token and group of 16, MXFP4
    /// when of 32).
    pub bits: u32,
    /// `type: float` (FP8 E4M3, or FP4 E2M1); else `int` (int8).
    pub float: bool,
    /// `strategy`: `token`, `tensor`, or `group` with `group_size` (`tensor_group` for NVFP4).
    pub granularity: ActivationGranularity,
}

impl CtActivations {
    /// What the reports and `qdrift eval` call it.
    pub(crate) fn checkpoint(self) -> CheckpointActivations {
        let format = match (self.bits, self.float, self.granularity) {
            (4, _, ActivationGranularity::TokenGroup(16)) => ActivationFormat::Nvfp4,
            (4, ..) => ActivationFormat::Mxfp4,
            (_, true, _) => ActivationFormat::Fp8E4M3,
            (_, false, _) => ActivationFormat::Int8,
        };
        CheckpointActivations { format, granularity: self.granularity }
    }
}

const CT_FORMATS: &str =
    "pack-quantized, int-quantized, naive-quantized, float-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized";

fn ct_format(f: &Fields<'_>, key: &str) -> Result<Option<CtFormat>, LoadError> {
    Ok(match f.str(key)? {
        None => None,
        Some("pack-quantized") => Some(CtFormat::Packed),
        Some("int-quantized" | "naive-quantized") => Some(CtFormat::Int),
        Some("float-quantized") => Some(CtFormat::Float),
        Some("nvfp4-pack-quantized") => Some(CtFormat::Nvfp4),
        Some("mxfp4-pack-quantized") => Some(CtFormat::Mxfp4),
        Some(other) => return Err(f.unsupported(key, other, CT_FORMATS)),
    })
}

impl Compressed {
    /// Parses the config (see the module doc) and compiles its patterns; returns it with the
    /// format's name in reports (`compressed-tensors pack-quantized int4 group 128`) and the
    /// declared activations.
    pub(crate) fn parse(f: &Fields<'_>) -> Result<(ReadCompressed, String, Option<CheckpointActivations>), LoadError> {
        parse_compressed(f)
    }
}

/// A compressed-tensors config as read: the config and its `ignore` and `targets` patterns,
/// compiled once.
#[derive(Debug, Clone)]
pub(crate) struct ReadCompressed {
    /// The config.
    pub(crate) config: Compressed,
    /// `ignore`, compiled.
    ignore: Vec<ModulePattern>,
    /// Each group's `targets`, compiled.
    targets: Vec<Vec<ModulePattern>>,
}

impl ReadCompressed {
    /// The group quantizing `module`: not ignored, matched by a target (`Linear` matches every
    /// linear layer).
    pub(crate) fn scheme_of(&self, module: &str) -> Option<&CtScheme> {
        if self.ignore.iter().any(|p| p.matches(module)) {
            return None;
        }
        self.config
            .groups
            .iter()
            .zip(&self.targets)
            .find(|(_, targets)| targets.iter().any(|t| t.matches(module)))
            .map(|(g, _)| &g.scheme)
    }
}

/// Compiled regular expressions stay below this many bytes (`regex`'s `size_limit`; its default
/// is 10 MiB): a pattern past it is refused instead of compiled slowly into a huge automaton.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// One entry of `ignore` or `targets`: `Linear` (targets only: every linear layer), a module
/// name, or a `re:` pattern matched as Python's `re.match` does (anchored at the start, not at
/// the end), in linear time.
#[derive(Debug, Clone)]
enum ModulePattern {
    /// `Linear` in `targets`.
    Linear,
    /// A module name, matched exactly.
    Name(String),
    /// A `re:` pattern, compiled as `^(?:PATTERN)`.
    Re(regex::Regex),
}

impl ModulePattern {
    /// Compiles entry `pattern` of list `key` of `f` (`ignore`, `targets`); `Linear` is special
    /// in `targets` only. A `re:` pattern Rust's `regex` does not accept (look-around,
    /// backreferences) or that compiles past [`PATTERN_SIZE_LIMIT`] is refused, naming the field
    /// and the pattern.
    fn compile(f: &Fields<'_>, key: &str, pattern: &str) -> Result<Self, LoadError> {
        let Some(re) = pattern.strip_prefix("re:") else {
            return Ok(if key == "targets" && pattern == "Linear" {
                ModulePattern::Linear
            } else {
                ModulePattern::Name(pattern.to_string())
            });
        };
        regex::RegexBuilder::new(&format!("^(?:{re})"))
            .size_limit(PATTERN_SIZE_LIMIT)
            .dfa_size_limit(PATTERN_SIZE_LIMIT)
            .build()
            .map(ModulePattern::Re)
            .map_err(|e| {
                let why = match &e {
                    regex::Error::CompiledTooBig(limit) => format!("it compiles past the {limit}-byte size limit"),
                    // The syntax error's last line says what is wrong (the lines before quote the
                    // pattern and point into it).
                    other => other
                        .to_string()
                        .lines()
                        .rev()
                        .find_map(|l| l.strip_prefix("error: "))
                        .map_or_else(|| "it is not a regular expression".to_string(), |l| l.to_string()),
                };
                f.unsupported(
                    key,
                    pattern,
                    &format!(
                        "module names, `Linear` and `re:` patterns of Rust's regex syntax (no look-around or \
                         backreferences), compiling within {PATTERN_SIZE_LIMIT} bytes; this one: {why}"
                    ),
                )
            })
    }

    /// Whether this entry names `module`.
    fn matches(&self, module: &str) -> bool {
        match self {
            ModulePattern::Linear => true,
            ModulePattern::Name(name) => name == module,
            ModulePattern::Re(re) => re.is_match(module),
        }
    }
}

fn parse_compressed(f: &Fields<'_>) -> Result<(ReadCompressed, String, Option<CheckpointActivations>), LoadError> {
    let top_format = ct_format(f, "format")?;
    if let Some(status) = f.str("quantization_status")?
        && status != "compressed"
    {
        return Err(f.unsupported("quantization_status", status, "compressed"));
    }
    if let Some(sparsity) = f.child("sparsity_config")
        && sparsity.str("format")?.is_some_and(|s| s != "dense")
    {
        return Err(sparsity.unsupported("format", sparsity.str("format")?.unwrap_or(""), "dense (no sparsity)"));
    }
    if let Some(kv) = f.get("kv_cache_scheme") {
        return Err(f.unsupported(
            "kv_cache_scheme",
            kv,
            "null (qdrift's KV-cache roundings are variant recipes, `+kv-...`; stored KV scales are not reproduced)",
        ));
    }
    let ignore = match f.get("ignore") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| LoadError::invalid(f.path, format!("{} is not a list of strings", f.field("ignore"))))?,
    };
    let ignore_patterns = ignore.iter().map(|p| ModulePattern::compile(f, "ignore", p)).collect::<Result<_, _>>()?;
    let Some(groups_obj) = f.get("config_groups").and_then(Value::as_object) else {
        return Err(LoadError::invalid(f.path, format!("{} is missing or not an object", f.field("config_groups"))));
    };
    let mut groups = Vec::new();
    let mut activations: Option<Option<CtActivations>> = None;
    let mut names = Vec::new();
    let mut target_patterns = Vec::new();
    for (name, g) in groups_obj {
        let g = Fields { path: f.path, prefix: f.field(&format!("config_groups.{name}")), v: g };
        let targets: Vec<String> = g
            .get("targets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| LoadError::invalid(f.path, format!("{} is not a list of strings", g.field("targets"))))?;
        target_patterns
            .push(targets.iter().map(|t| ModulePattern::compile(&g, "targets", t)).collect::<Result<_, _>>()?);
        let format = ct_format(&g, "format")?.or(top_format).ok_or_else(|| {
            LoadError::invalid(f.path, format!("{} has no format (nor has quantization_config)", g.field("format")))
        })?;
        let Some(w) = g.child("weights") else {
            return Err(g.unsupported(
                "weights",
                "null",
                "a weights scheme (activation-only quantization is not read)",
            ));
        };
        let weights = parse_ct_weights(&w, format)?;
        if let Some(out) = g.get("output_activations") {
            return Err(g.unsupported("output_activations", out, "null"));
        }
        let act = g.child("input_activations").map(|a| parse_ct_activations(&a)).transpose()?;
        match activations {
            None => activations = Some(act),
            Some(prev) if prev != act => {
                return Err(g.unsupported(
                    "input_activations",
                    act.map_or("none".into(), |a| a.checkpoint().to_string()),
                    &format!(
                        "one activation scheme for every group ({} elsewhere)",
                        prev.map_or("none".into(), |a| a.checkpoint().to_string())
                    ),
                ));
            }
            Some(_) => {}
        }
        names.push(ct_name(format, &weights));
        groups.push(CtGroup { targets, scheme: CtScheme { format, weights, activations: act } });
    }
    if groups.is_empty() {
        return Err(LoadError::invalid(f.path, format!("{} is empty", f.field("config_groups"))));
    }
    names.dedup();
    let summary = format!("compressed-tensors {}", names.join(" + "));
    let read =
        ReadCompressed { config: Compressed { groups, ignore }, ignore: ignore_patterns, targets: target_patterns };
    Ok((read, summary, activations.flatten().map(CtActivations::checkpoint)))
}

fn ct_name(ct_format: CtFormat, w: &CtWeights) -> String {
    let format = format_name(ct_format);
    let kind = if w.float { format!("fp{}", w.bits) } else { format!("int{}", w.bits) };
    if let Some(fp4) = ct_format.fp4() {
        return format!("{format} fp4 group {}", fp4.group());
    }
    let strategy = match w.strategy {
        Strategy::Tensor => "per tensor".to_string(),
        Strategy::Channel => "per channel".to_string(),
        Strategy::Group(g) => format!("group {g}"),
        Strategy::Block(r, c) => format!("block {r}x{c}"),
    };
    let sym = if w.symmetric { "" } else { " asym" };
    format!("{format} {kind} {strategy}{sym}")
}

fn parse_ct_weights(w: &Fields<'_>, format: CtFormat) -> Result<CtWeights, LoadError> {
    let float = match w.str("type")?.unwrap_or("int") {
        "int" => false,
        "float" => true,
        other => return Err(w.unsupported("type", other, "int, float")),
    };
    let bits = w.int("num_bits")?.unwrap_or(8);
    let bits = match (float, format, bits) {
        (true, CtFormat::Nvfp4 | CtFormat::Mxfp4, 4) => 4,
        (_, CtFormat::Nvfp4 | CtFormat::Mxfp4, _) => {
            let t = if float { "float" } else { "int" };
            return Err(w.unsupported("type/num_bits", format!("{t}/{bits}"), "float/4 (FP4 formats)"));
        }
        (false, CtFormat::Packed, 4 | 8) | (false, CtFormat::Int, 8) | (true, CtFormat::Float, 8) => bits as u32,
        (false, CtFormat::Packed, _) => return Err(w.unsupported("num_bits", bits, "4, 8 (pack-quantized)")),
        (false, CtFormat::Int, _) => return Err(w.unsupported("num_bits", bits, "8 (int-quantized)")),
        (true, CtFormat::Float, _) => return Err(w.unsupported("num_bits", bits, "8 (float-quantized)")),
        (true, _, _) => return Err(w.unsupported("type", "float", "int (float weights need float-quantized)")),
        (false, CtFormat::Float, _) => {
            return Err(w.unsupported("type", "int", "float (float-quantized stores FP8 weights)"));
        }
    };
    let symmetric = w.flag("symmetric", true)?;
    if float && !symmetric {
        return Err(w.unsupported("symmetric", false, "true (FP8 weights)"));
    }
    let strategy = match w.str("strategy")?.unwrap_or("tensor") {
        "tensor" => Strategy::Tensor,
        "channel" => Strategy::Channel,
        "group" => match w.group_size("group_size")? {
            Some(g) => Strategy::Group(g),
            None => Strategy::Channel,
        },
        // NVFP4: groups with a per-tensor global scale on top.
        "tensor_group" if format == CtFormat::Nvfp4 => Strategy::Group(w.group_size("group_size")?.unwrap_or(0)),
        "block" => {
            let dims: Option<Vec<usize>> = w.get("block_structure").and_then(Value::as_array).map(|a| {
                a.iter().filter_map(Value::as_u64).filter_map(|d| usize::try_from(d).ok()).filter(|&d| d > 0).collect()
            });
            match dims.as_deref() {
                Some(&[r, c]) => Strategy::Block(r, c),
                _ => {
                    return Err(w.unsupported(
                        "block_structure",
                        w.get("block_structure").map_or("(missing)".into(), Value::to_string),
                        "[rows, cols] of positive integers",
                    ));
                }
            }
        }
        other => return Err(w.unsupported("strategy", other, "tensor, channel, group, block")),
    };
    if let Some(fp4) = format.fp4() {
        let (strategy_name, group) = match fp4 {
            Fp4Kind::Nvfp4 => ("tensor_group", 16),
            Fp4Kind::Mxfp4 => ("group", 32),
        };
        if strategy != Strategy::Group(group) || !symmetric {
            return Err(w.unsupported(
                "strategy",
                w.str("strategy")?.unwrap_or("tensor"),
                &format!("{strategy_name} with group_size {group}, symmetric ({})", format_name(format)),
            ));
        }
    }
    if !symmetric && format == CtFormat::Packed && !matches!(strategy, Strategy::Channel | Strategy::Group(_)) {
        return Err(w.unsupported(
            "strategy",
            "tensor or block with symmetric false",
            "channel or group when asymmetric",
        ));
    }
    Ok(CtWeights { bits, float, symmetric, strategy })
}

fn parse_ct_activations(a: &Fields<'_>) -> Result<CtActivations, LoadError> {
    if a.int("num_bits")? == Some(4) && a.str("type")? == Some("float") {
        return parse_fp4_activations(a);
    }
    let supported = "dynamic: true (qdrift computes activation scales at run time; static scales are not reproduced)";
    match a.get("dynamic") {
        Some(Value::Bool(true)) => {}
        other => return Err(a.unsupported("dynamic", other.map_or("(missing)".into(), Value::to_string), supported)),
    }
    if !a.flag("symmetric", true)? {
        return Err(a.unsupported("symmetric", false, "true (symmetric activations)"));
    }
    let bits = a.int("num_bits")?.unwrap_or(8);
    let float = match (a.str("type")?.unwrap_or("int"), bits) {
        ("int", 8) => false,
        ("float", 8) => true,
        (t, b) => return Err(a.unsupported("type/num_bits", format!("{t}/{b}"), "int/8, float/8")),
    };
    let granularity = match a.str("strategy")?.unwrap_or("tensor") {
        "token" => ActivationGranularity::Token,
        "tensor" => ActivationGranularity::Tensor,
        // llm-compressor's FP8_BLOCK preset: per token and group of `group_size` inputs.
        "group" => match a.group_size("group_size")? {
            Some(g) => ActivationGranularity::TokenGroup(g),
            None => return Err(a.unsupported("group_size", "-1 or missing", "a positive group size")),
        },
        other => return Err(a.unsupported("strategy", other, "token, tensor, group")),
    };
    Ok(CtActivations { bits: 8, float, granularity })
}

/// FP4 `input_activations`, as compressed-tensors 0.20.1's `NVFP4` and `MXFP4` presets write
/// them (`quantization/quant_scheme.py`); other FP4 forms are refused.
fn parse_fp4_activations(a: &Fields<'_>) -> Result<CtActivations, LoadError> {
    const FORMS: &str = "NVFP4 (strategy tensor_group, group_size 16, dynamic \"local\") or MXFP4 (strategy group, \
                         group_size 32, dynamic true), symmetric";
    if !a.flag("symmetric", true)? {
        return Err(a.unsupported("symmetric", false, FORMS));
    }
    let strategy = a.str("strategy")?.unwrap_or("tensor");
    let group = a.group_size("group_size")?;
    let dynamic = a.get("dynamic").cloned().unwrap_or(Value::Null);
    let g = match (strategy, group, &dynamic) {
        ("tensor_group", Some(16), Value::String(d)) if d == "local" => 16,
        ("group", Some(32), Value::Bool(true)) => 32,
        ("tensor_group" | "group", Some(_), _) => {
            return Err(a.unsupported("group_size/dynamic", format!("{group:?}/{dynamic}"), FORMS));
        }
        _ => return Err(a.unsupported("strategy", strategy, FORMS)),
    };
    Ok(CtActivations { bits: 4, float: true, granularity: ActivationGranularity::TokenGroup(g) })
}

impl CtScheme {
    /// Dequantizes linear layer `module` (see the module doc).
    ///
    /// # Shapes
    /// - `weight_packed`: `[out, ⌈inp/pf⌉]` I32 (pack-quantized) or `weight` `[out, inp]` (I8, FP8);
    ///   `weight_scale` and `weight_zero_point` on the strategy's grid; returns `[out, inp]`.
    pub(crate) fn unpack(&self, shards: &Shards, module: &str, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
        if let Some(kind) = self.format.fp4() {
            return fp4::unpack_ct(kind, shards, module, out, inp);
        }
        let w = self.weights;
        let (rows, cols) = w.strategy.grid(out, inp);
        let scale_name = format!("{module}.weight_scale");
        let scales = shards.floats_any(&scale_name, &w.strategy.scale_shapes(out, inp))?;
        let g_idx_name = format!("{module}.weight_g_idx");
        let g_idx = match (w.strategy, shards.has(&g_idx_name)) {
            (Strategy::Group(size), true) => Some(group_index(shards, &g_idx_name, Some(size), inp)?.1),
            _ => None,
        };
        let zp_name = format!("{module}.weight_zero_point");
        let scale_at = |o: usize, i: usize| w.strategy.index(o, i, cols, g_idx.as_deref());
        if self.format == CtFormat::Float {
            let name = format!("{module}.weight");
            let (format, bytes) = shards.fp8(&name, &[out, inp])?;
            return Ok((0..out * inp).map(|k| format.decode(bytes[k]) * scales[scale_at(k / inp, k % inp)]).collect());
        }
        let offset = 1i32 << (w.bits - 1);
        let codes: Vec<i32> = if self.format == CtFormat::Packed {
            let pf = 32 / w.bits as usize;
            let shape_name = format!("{module}.weight_shape");
            if shards.has(&shape_name) {
                let shape = shards.ints_any(&shape_name, &[2])?;
                if shape != [out as i64, inp as i64] {
                    return Err(LoadError::invalid(
                        shards.path_of(&shape_name).unwrap_or(Path::new(".")),
                        format!("tensor {shape_name} is {shape:?}; expected [{out}, {inp}]"),
                    ));
                }
            }
            let packed = shards.ints(&format!("{module}.weight_packed"), &[out, inp.div_ceil(pf)])?;
            let words = inp.div_ceil(pf);
            (0..out * inp)
                .map(|k| {
                    let (o, i) = (k / inp, k % inp);
                    field(packed[o * words + i / pf], w.bits, i % pf) - offset
                })
                .collect()
        } else {
            let name = format!("{module}.weight");
            signed_in_range(shards, &name, shards.ints_any(&name, &[out, inp])?, w.bits, "code")?
        };
        let zeros: Option<Vec<i32>> = if w.symmetric {
            None
        } else if self.format == CtFormat::Packed {
            let pf = 32 / w.bits as usize;
            let packed = shards.ints(&zp_name, &[rows.div_ceil(pf), cols])?;
            Some(
                (0..rows * cols)
                    .map(|k| field(packed[(k / cols / pf) * cols + k % cols], w.bits, (k / cols) % pf) - offset)
                    .collect(),
            )
        } else {
            let shapes = w.strategy.scale_shapes(out, inp);
            Some(signed_in_range(shards, &zp_name, shards.numbers_any(&zp_name, &shapes)?, w.bits, "zero point")?)
        };
        Ok((0..out * inp)
            .map(|k| {
                let s = scale_at(k / inp, k % inp);
                let z = zeros.as_ref().map_or(0, |z| z[s]);
                (codes[k] - z) as f32 * scales[s]
            })
            .collect())
    }

    /// Packs the integer codes of linear layer `module` in this scheme's format (see the module
    /// doc): `pack-quantized` as `weight_packed`, `weight_shape`, `weight_scale` and, when not
    /// symmetric, `weight_zero_point`; `int-quantized` as an I8 `weight` (symmetric codes: the
    /// zero points, `2^(bits−1)`, are not stored) and `weight_scale`. The scales are written on
    /// the `[out, groups]` grid (`[out, 1]` per channel); `None` for `float-quantized`.
    ///
    /// # Shapes
    /// - `codes`: as [`IntCodes`] says; returns `weight_packed` `[out, ⌈inp/pf⌉]`,
    ///   `weight_shape` `[2]`, `weight_scale` `[out, groups]`, `weight_zero_point`
    ///   `[⌈out/pf⌉, groups]`; or `weight` `[out, inp]` and `weight_scale` `[out, groups]`.
    pub fn pack_int(&self, module: &str, codes: &IntCodes<'_>) -> Option<Vec<HfTensor>> {
        let (out, inp, groups, bits) = (codes.out, codes.inp, codes.groups(), self.weights.bits);
        let name = |suffix: &str| format!("{module}.{suffix}");
        let scales = HfTensor::floats(name("weight_scale"), codes.scale_dtype, vec![out, groups], codes.scales);
        match self.format {
            CtFormat::Float | CtFormat::Nvfp4 | CtFormat::Mxfp4 => None,
            CtFormat::Int => {
                let offset = 1i32 << (bits - 1);
                let signed = codes.codes.iter().map(|&q| (q - offset) as i8 as u8).collect();
                let weight =
                    HfTensor { name: name("weight"), dtype: HfDtype::I8, shape: vec![out, inp], bytes: signed };
                Some(vec![weight, scales])
            }
            CtFormat::Packed => {
                let pf = 32 / bits as usize;
                let words = inp.div_ceil(pf);
                let mut packed = vec![0i32; out * words];
                for o in 0..out {
                    for i in 0..inp {
                        put(&mut packed[o * words + i / pf], bits, i % pf, codes.codes[o * inp + i]);
                    }
                }
                let shape = [out as i64, inp as i64].iter().flat_map(|x| x.to_le_bytes()).collect();
                let mut parts = vec![
                    HfTensor::i32(name("weight_packed"), vec![out, words], &packed),
                    HfTensor { name: name("weight_shape"), dtype: HfDtype::I64, shape: vec![2], bytes: shape },
                    scales,
                ];
                if !self.weights.symmetric {
                    let mut zp = vec![0i32; out.div_ceil(pf) * groups];
                    for o in 0..out {
                        for g in 0..groups {
                            put(&mut zp[(o / pf) * groups + g], bits, o % pf, codes.zeros[o * groups + g]);
                        }
                    }
                    parts.push(HfTensor::i32(name("weight_zero_point"), vec![out.div_ceil(pf), groups], &zp));
                }
                Some(parts)
            }
        }
    }

    /// Packs the FP8 codes of linear layer `module` in the `float-quantized` format: `weight` in
    /// its FP8 dtype and `weight_scale` F32 `[out, 1]` (per channel); `None` for another format
    /// or strategy.
    ///
    /// # Shapes
    /// - `codes`: `[out, inp]` codes, `[out]` scales; returns `weight` `[out, inp]`,
    ///   `weight_scale` `[out, 1]`.
    pub fn pack_fp8(&self, module: &str, codes: &Fp8Codes<'_>) -> Option<Vec<HfTensor>> {
        if self.format != CtFormat::Float || self.weights.strategy != Strategy::Channel {
            return None;
        }
        let scale = HfTensor::floats(format!("{module}.weight_scale"), HfDtype::F32, vec![codes.out, 1], codes.scales);
        Some(vec![codes.weight(module), scale])
    }
}

impl CtScheme {
    /// Packs the FP4 codes of linear layer `module` in this scheme's FP4 format (`fp4.rs`);
    /// `None` for the other formats.
    ///
    /// # Shapes
    /// - `codes`: as [`Fp4Codes`] says; returns `weight_packed` `[out, inp/2]`, `weight_scale`
    ///   `[out, inp/group]` and, for NVFP4, `weight_global_scale` `[1]`.
    pub fn pack_fp4(&self, module: &str, codes: &Fp4Codes<'_>) -> Option<Vec<HfTensor>> {
        self.format.fp4().map(|kind| fp4::pack_ct(kind, module, codes))
    }
}

/// `values` of tensor `name`, `bits`-bit signed integers (`int-quantized` codes, zero points in
/// any integer or float dtype): each in `−2^(bits−1) ..= 2^(bits−1) − 1`, else refused naming the
/// tensor and the flat index, so that no code is truncated and `q − z` cannot overflow.
fn signed_in_range(
    shards: &Shards,
    name: &str,
    values: Vec<i64>,
    bits: u32,
    what: &str,
) -> Result<Vec<i32>, LoadError> {
    let (lo, hi) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
    values
        .into_iter()
        .enumerate()
        .map(|(k, v)| {
            i32::try_from(v).ok().filter(|_| (lo..=hi).contains(&v)).ok_or_else(|| {
                LoadError::invalid(
                    shards.path_of(name).unwrap_or(Path::new(".")),
                    format!("tensor {name}[{k}] = {v} is not an int{bits} {what} (in {lo}..={hi})"),
                )
            })
        })
        .collect()
}

impl Compressed {
    /// `config.json`'s `quantization_config` for this config, as JSON text: the first group's
    /// format as the config's `format` (a group with another format names its own), groups as
    /// `group_0`, `group_1`, ..., no KV-cache scheme, no sparsity.
    pub fn quantization_config(&self) -> String {
        let top = self.groups.first().map(|g| g.scheme.format);
        let groups: serde_json::Map<String, Value> = self
            .groups
            .iter()
            .enumerate()
            .map(|(k, g)| {
                let mut group = json!({
                    "targets": g.targets,
                    "weights": weights_json(&g.scheme.weights, g.scheme.format),
                    "input_activations": g.scheme.activations.map_or(Value::Null, activations_json),
                    "output_activations": null,
                });
                if Some(g.scheme.format) != top {
                    group["format"] = json!(format_name(g.scheme.format));
                }
                (format!("group_{k}"), group)
            })
            .collect();
        json!({
            "quant_method": "compressed-tensors",
            "format": top.map(format_name),
            "quantization_status": "compressed",
            "ignore": self.ignore,
            "kv_cache_scheme": null,
            "sparsity_config": null,
            "config_groups": groups,
        })
        .to_string()
    }
}

/// `format`'s name in a config.
fn format_name(format: CtFormat) -> &'static str {
    match format {
        CtFormat::Packed => "pack-quantized",
        CtFormat::Int => "int-quantized",
        CtFormat::Float => "float-quantized",
        CtFormat::Nvfp4 => "nvfp4-pack-quantized",
        CtFormat::Mxfp4 => "mxfp4-pack-quantized",
    }
}

/// A group's `weights` object (NVFP4's groups are `tensor_group`).
fn weights_json(w: &CtWeights, format: CtFormat) -> Value {
    let mut v = json!({
        "num_bits": w.bits,
        "type": if w.float { "float" } else { "int" },
        "symmetric": w.symmetric,
        "dynamic": false,
    });
    match w.strategy {
        Strategy::Tensor => v["strategy"] = json!("tensor"),
        Strategy::Channel => v["strategy"] = json!("channel"),
        Strategy::Group(g) => {
            v["strategy"] = json!(if format == CtFormat::Nvfp4 { "tensor_group" } else { "group" });
            v["group_size"] = json!(g);
        }
        Strategy::Block(r, c) => {
            v["strategy"] = json!("block");
            v["block_structure"] = json!([r, c]);
        }
    }
    v
}

/// A group's `input_activations` object.
fn activations_json(a: CtActivations) -> Value {
    if a.bits == 4 {
        let (strategy, dynamic) = match a.granularity {
            ActivationGranularity::TokenGroup(16) => ("tensor_group", json!("local")),
            _ => ("group", json!(true)),
        };
        let group = match a.granularity {
            ActivationGranularity::TokenGroup(g) => g,
            _ => 32,
        };
        return json!({
            "num_bits": 4, "type": "float", "symmetric": true,
            "strategy": strategy, "group_size": group, "dynamic": dynamic,
        });
    }
    let mut v = json!({
        "num_bits": 8,
        "type": if a.float { "float" } else { "int" },
        "dynamic": true,
        "symmetric": true,
    });
    match a.granularity {
        ActivationGranularity::Token => v["strategy"] = json!("token"),
        ActivationGranularity::Tensor => v["strategy"] = json!("tensor"),
        ActivationGranularity::TokenGroup(g) => {
            v["strategy"] = json!("group");
            v["group_size"] = json!(g);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pattern` compiled as a `targets` entry.
    fn pattern(pattern: &str) -> ModulePattern {
        let v = Value::Null;
        let f = Fields { path: Path::new("config.json"), prefix: "quantization_config".into(), v: &v };
        ModulePattern::compile(&f, "targets", pattern).expect("compiles")
    }

    fn matches(p: &str, module: &str) -> bool {
        pattern(p).matches(module)
    }

    #[test]
    fn re_patterns_match_as_python_re_match() {
        assert!(matches("lm_head", "lm_head"));
        assert!(!matches("lm_head", "model.lm_head"));
        assert!(matches("re:.*lm_head", "lm_head"));
        assert!(matches("re:^lm_head$", "lm_head"));
        assert!(matches("re:.*mlp.down_proj$", "model.layers.3.mlp.down_proj"));
        assert!(!matches("re:.*mlp.down_proj$", "model.layers.3.mlp.down_proj2"));
        assert!(matches("re:model\\.layers\\.0\\..*", "model.layers.0.self_attn.q_proj"));
        assert!(!matches("re:model\\.layers\\.0\\..*", "model.layers.10.self_attn.q_proj"));
        // Anchored at the start only, as `re.match`; alternation and classes as in Python.
        assert!(matches("re:model", "model.layers.0.mlp.up_proj"));
        assert!(!matches("re:layers", "model.layers.0.mlp.up_proj"));
        assert!(matches("re:.*(q|k)_proj", "model.layers.0.self_attn.k_proj"));
        assert!(!matches("re:a|.*(q|k)_proj$", "model.layers.0.self_attn.v_proj"));
        assert!(matches("re:.*layers\\.[0-9]+\\.mlp\\.(gate|up)_proj$", "model.layers.12.mlp.gate_proj"));
        assert!(matches("Linear", "anything"));
    }

    #[test]
    fn many_stars_match_in_linear_time() {
        let p = format!("re:{}z$", ".*".repeat(40));
        let t = std::time::Instant::now();
        assert!(!matches(&p, &"model.layers.0.self_attn.q_proj".repeat(30)));
        assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
    }

    fn refusal(key: &str, pattern: &str) -> String {
        let v = Value::Null;
        let f = Fields { path: Path::new("config.json"), prefix: "quantization_config".into(), v: &v };
        ModulePattern::compile(&f, key, pattern).expect_err("refused").to_string()
    }

    #[test]
    fn look_around_backreferences_and_huge_patterns_are_refused_naming_field_and_pattern() {
        let e = refusal("ignore", "re:(?!lm_head).*");
        assert!(e.contains("quantization_config.ignore") && e.contains("re:(?!lm_head).*"), "{e}");
        assert!(e.contains("look-around"), "{e}");
        let e = refusal("targets", "re:(a)\\1");
        assert!(e.contains("quantization_config.targets") && e.contains("backreferences"), "{e}");
        let e = refusal("targets", "re:((a{100}){100}){100}");
        assert!(e.contains("size limit"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let long = format!("re:({}", "a".repeat(100_000));
        let e = refusal("targets", &long);
        assert!(e.len() < 1000 && e.contains("(100004 bytes)"), "{e}");
    }
}
