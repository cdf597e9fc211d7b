//! Quantized Hugging Face folders: `quantization_config` in `config.json` (or AutoGPTQ's
//! `quantize_config.json`), each linear layer dequantized on load into [`crate::HostModel`]'s
//! f32 `[out, in]` layout. The reader ([`crate::read_hf_folder`]) permutes q/k rows to the
//! interleaved RoPE layout *after* dequantization, so the permutation moves real rows.
//!
//! Every format below stores integer codes `q` (or FP8 codes), scales `s` and, for asymmetric
//! formats, zero points `z`; qdrift computes `w = (q − z) · s` in f32. For F16/BF16 scales this
//! product is exact (an ≤ 9-bit integer times an 11-bit mantissa), so the weights are the exact
//! values the checkpoint encodes; PyTorch kernels that multiply in the scale's dtype round it
//! once more to F16/BF16. A linear layer the checkpoint leaves unquantized (`lm_head`,
//! `modules_to_not_convert`, compressed-tensors' `ignore`) is read as a plain F32/F16/BF16
//! `.weight`.
//!
//! **GPTQ** (`quant_method: gptq`; bits 4 or 8, `group_size` G or −1, `desc_act`, `sym`),
//! following AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py` `QuantLinear.pack` and
//! its `forward` dequantization, and GPTQModel `gptqmodel/nn_modules/qlinear/__init__.py`
//! (`PackableQuantLinear.pack` / `dequantize_weight`); `transformers` docs
//! `docs/source/en/quantization/gptq.md`. With `pf = 32 / bits`:
//! - `qweight` I32 `[in / pf, out]`: input `i` of output `o` is bits `bits·(i mod pf)` up of
//!   `qweight[i / pf, o]` (low bits first), an unsigned code;
//! - `qzeros` I32 `[groups, out / pf]`: zero point of output `o` in group `g` is bits
//!   `bits·(o mod pf)` up of `qzeros[g, o / pf]`;
//! - `scales` F16 `[groups, out]`; `g_idx` I32 `[in]` (the group of each input; act-order
//!   `desc_act` checkpoints permute it; absent means `i / G`).
//! - `checkpoint_format: gptq` (v1, AutoGPTQ; the default) stores `z − 1`, so the reader adds 1
//!   to the unpacked field and masks to `bits` bits again (AutoGPTQ's `zeros = zeros + 1;
//!   zeros = bitwise_and(zeros, 2^bits − 1)`: a stored 15 is zero point 0); `gptq_v2`
//!   (GPTQModel) stores `z`. `w[o, i] = (q − z[g_idx[i], o]) · s[g_idx[i], o]`.
//!
//! **AWQ** (`quant_method: awq`, `version: gemm`, 4 bits, `zero_point: true`), following AutoAWQ
//! `awq/modules/linear/gemm.py` `WQLinear_GEMM.from_linear` and `awq/utils/packing_utils.py`
//! (`AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`, `AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`):
//! `qweight` I32 `[in, out / 8]`, nibble `k` (bits `4k` up) of `qweight[i, c]` holds output
//! `8c + AWQ_ORDER[k]`; `qzeros` I32 `[groups, out / 8]` packed alike; `scales` F16
//! `[groups, out]`; groups of G consecutive inputs. `w[o, i] = (q − z) · s`. `gemv`, `gemv_fast`,
//! `marlin`, `exllama` and `ipex` layouts are refused.
//!
//! **compressed-tensors** (`quant_method: compressed-tensors`), following
//! `compressed_tensors/compressors/quantized_compressors/pack_quantized.py` (`pack_to_int32`,
//! `unpack_from_int32`), `naive_quantized.py`, `float_quantized.py` and
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
//!
//! `input_activations` with `dynamic: true`, symmetric, int8 or FP8, per `token`, per `tensor`
//! or per token and `group` (`group_size` G; llm-compressor's `FP8_BLOCK` preset), becomes [`CheckpointQuant::activations`] (`qdrift eval` rounds a checkpoint
//! variant's linear inputs with it); static activation scales, asymmetric activations and other
//! strategies are refused, as are `output_activations`, a `kv_cache_scheme`, sparsity and
//! `tensor_group` (NVFP4) weights.
//!
//! **FP8** (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [128, 128]`,
//! `activation_scheme: dynamic`; DeepSeek-V3, Qwen3-FP8), following `transformers`
//! `integrations/finegrained_fp8.py` (`FP8Linear`) and DeepSeek-V3's `inference/kernel.py`
//! `weight_dequant`: `weight` F8_E4M3/F8_E5M2 `[out, in]`, `weight_scale_inv` F32
//! `[⌈out/bh⌉, ⌈in/bw⌉]` for blocks (or `[1]` per tensor, `[out]`/`[out, 1]` per channel),
//! `w = fp8 · scale_inv[block]`. FP8 values decode with [`crate::ofp8`] (OCP OFP8 v1.0).
//! `activation_scheme: dynamic` is FP8 E4M3 activations, per tensor (vLLM's `Fp8LinearMethod`),
//! or per token and group of `bw` inputs with blocks ([`ActivationGranularity::TokenGroup`]);
//! `static` (stored `input_scale`s) is refused, and so is DeepSeek-V3.1's `scale_fmt: ue8m0`
//! (power-of-two activation scales).

use std::path::{Path, PathBuf};

use safetensors::Dtype;
use serde_json::Value;

use crate::hf::Shards;
use crate::ofp8::Ofp8;
use crate::{HostTensor, LoadError};

/// How a quantized checkpoint was stored, for reports and for the run-time roundings that come
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointQuant {
    /// A short description of the weight format: `gptq 4-bit g128 v1`, `awq 4-bit g128`,
    /// `compressed-tensors pack-quantized int4 group 128`, `fp8 e4m3 block 128x128`.
    pub weights: String,
    /// The checkpoint's dynamic activation quantization, if it declares one.
    pub activations: Option<CheckpointActivations>,
}

/// A checkpoint's dynamic quantization of the inputs of its linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointActivations {
    /// The number format.
    pub format: ActivationFormat,
    /// One scale per what.
    pub granularity: ActivationGranularity,
}

/// The number format of dynamically quantized activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationFormat {
    /// Symmetric int8.
    Int8,
    /// OCP FP8 E4M3.
    Fp8E4M3,
    /// OCP FP8 E5M2.
    Fp8E5M2,
}

/// Which values share one dynamic activation scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationGranularity {
    /// One scale per token.
    Token,
    /// One scale per tensor.
    Tensor,
    /// One scale per token and group of this many inputs (block FP8 checkpoints).
    TokenGroup(usize),
}

impl std::fmt::Display for CheckpointActivations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.format {
            ActivationFormat::Int8 => "int8",
            ActivationFormat::Fp8E4M3 => "fp8-e4m3",
            ActivationFormat::Fp8E5M2 => "fp8-e5m2",
        };
        match self.granularity {
            ActivationGranularity::Token => write!(f, "{format} per token"),
            ActivationGranularity::Tensor => write!(f, "{format} per tensor"),
            ActivationGranularity::TokenGroup(g) => write!(f, "{format} per token per group of {g}"),
        }
    }
}

/// The quantization of a folder, parsed from its config.
#[derive(Debug, Clone)]
pub(crate) struct HfQuant {
    /// The file the configuration came from (`config.json` or `quantize_config.json`).
    path: PathBuf,
    method: Method,
    /// What [`crate::LoadedModel::quantization`] reports.
    pub(crate) summary: CheckpointQuant,
}

#[derive(Debug, Clone)]
enum Method {
    Gptq { bits: u32, group: Option<usize>, v1: bool },
    Awq { group: Option<usize> },
    Compressed(Compressed),
    Fp8 { block: Option<(usize, usize)> },
}

#[derive(Debug, Clone)]
struct Compressed {
    groups: Vec<CtGroup>,
    ignore: Vec<String>,
}

#[derive(Debug, Clone)]
struct CtGroup {
    targets: Vec<String>,
    format: CtFormat,
    weights: CtWeights,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtFormat {
    Packed,
    Int,
    Float,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CtWeights {
    bits: u32,
    float: bool,
    symmetric: bool,
    strategy: Strategy,
}

/// Which weights share a scale (and zero point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Tensor,
    Channel,
    /// Groups of this many consecutive inputs of a row.
    Group(usize),
    /// Blocks of `(rows, cols)`.
    Block(usize, usize),
}

/// A JSON object of a config with the path of its fields, for errors that name the field.
struct Fields<'a> {
    path: &'a Path,
    prefix: String,
    v: &'a Value,
}

impl<'a> Fields<'a> {
    fn field(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_string() } else { format!("{}.{key}", self.prefix) }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    fn child(&self, key: &str) -> Option<Fields<'a>> {
        self.get(key).filter(|v| v.is_object()).map(|v| Fields { path: self.path, prefix: self.field(key), v })
    }

    fn unsupported(&self, key: &str, value: impl std::fmt::Display, supported: &str) -> LoadError {
        LoadError::unsupported(self.path, self.field(key), value, supported)
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(LoadError::invalid(self.path, format!("{} is {v}, not a string", self.field(key)))),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| LoadError::invalid(self.path, format!("{} is {v}, not an integer", self.field(key)))),
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, LoadError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(LoadError::invalid(self.path, format!("{} is {v}, not true or false", self.field(key)))),
        }
    }

    /// A group size: a positive integer, or −1 (one group per row).
    fn group_size(&self, key: &str) -> Result<Option<usize>, LoadError> {
        match self.int(key)? {
            None | Some(-1) => Ok(None),
            Some(g) if g > 0 => Ok(usize::try_from(g).ok()),
            Some(g) => Err(self.unsupported(key, g, "a positive group size or -1")),
        }
    }
}

/// The folder's quantization: `config.json`'s `quantization_config`, else `quantize_config.json`
/// (AutoGPTQ); `None` for an unquantized folder.
pub(crate) fn read_quant_config(dir: &Path, config_path: &Path, config: &Value) -> Result<Option<HfQuant>, LoadError> {
    if let Some(q) = config.get("quantization_config").filter(|v| !v.is_null()) {
        if !q.is_object() {
            return Err(LoadError::invalid(config_path, "quantization_config is not an object"));
        }
        return parse(Fields { path: config_path, prefix: "quantization_config".into(), v: q }, None).map(Some);
    }
    let legacy = dir.join("quantize_config.json");
    if legacy.exists() {
        let bytes = crate::input::read_file(&legacy, crate::input::MAX_JSON_BYTES)?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| LoadError::invalid(&legacy, format!("not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(LoadError::invalid(&legacy, "is not a JSON object"));
        }
        // AutoGPTQ's file has no quant_method: it is GPTQ.
        return parse(Fields { path: &legacy, prefix: String::new(), v: &v }, Some("gptq")).map(Some);
    }
    Ok(None)
}

const METHODS: &str = "gptq, awq, compressed-tensors, fp8";

fn parse(f: Fields<'_>, default_method: Option<&str>) -> Result<HfQuant, LoadError> {
    let method = f.str("quant_method")?.or(default_method);
    let (method, weights, activations) = match method.map(str::to_ascii_lowercase).as_deref() {
        Some("gptq") => parse_gptq(&f)?,
        Some("awq") => parse_awq(&f)?,
        Some("compressed-tensors") => parse_compressed(&f)?,
        Some("fp8") => parse_fp8(&f)?,
        _ => return Err(f.unsupported("quant_method", method.unwrap_or("(missing)"), METHODS)),
    };
    Ok(HfQuant { path: f.path.to_path_buf(), method, summary: CheckpointQuant { weights, activations } })
}

type Parsed = (Method, String, Option<CheckpointActivations>);

fn group_name(group: Option<usize>) -> String {
    group.map_or_else(|| "per channel".to_string(), |g| format!("g{g}"))
}

fn parse_gptq(f: &Fields<'_>) -> Result<Parsed, LoadError> {
    let bits = match f.int("bits")? {
        Some(b @ (4 | 8)) => b as u32,
        other => return Err(f.unsupported("bits", other.map_or("(missing)".into(), |b| b.to_string()), "4, 8")),
    };
    let group = f.group_size("group_size")?;
    // `sym` and `desc_act` change how codes were chosen, not how they are stored: g_idx and the
    // stored zero points carry both.
    f.flag("sym", true)?;
    f.flag("desc_act", false)?;
    let format_key = if f.get("checkpoint_format").is_some() { "checkpoint_format" } else { "format" };
    let v1 = match f.str(format_key)? {
        None | Some("gptq") => true,
        Some("gptq_v2") => false,
        Some(other) => return Err(f.unsupported(format_key, other, "gptq (v1), gptq_v2")),
    };
    let name = format!("gptq {bits}-bit {} {}", group_name(group), if v1 { "v1" } else { "v2" });
    Ok((Method::Gptq { bits, group, v1 }, name, None))
}

fn parse_awq(f: &Fields<'_>) -> Result<Parsed, LoadError> {
    let version = f.str("version")?.unwrap_or("gemm");
    if !version.eq_ignore_ascii_case("gemm") {
        return Err(f.unsupported("version", version, "gemm"));
    }
    let bits_key = if f.get("w_bit").is_some() { "w_bit" } else { "bits" };
    match f.int(bits_key)? {
        Some(4) => {}
        other => return Err(f.unsupported(bits_key, other.map_or("(missing)".into(), |b| b.to_string()), "4")),
    }
    let group_key = if f.get("q_group_size").is_some() { "q_group_size" } else { "group_size" };
    let group = f.group_size(group_key)?;
    if !f.flag("zero_point", true)? {
        return Err(f.unsupported("zero_point", false, "true (GEMM's zero points)"));
    }
    Ok((Method::Awq { group }, format!("awq 4-bit {}", group_name(group)), None))
}

fn parse_fp8(f: &Fields<'_>) -> Result<Parsed, LoadError> {
    let fmt = f.str("fmt")?.unwrap_or("e4m3");
    if fmt != "e4m3" && fmt != "e5m2" {
        return Err(f.unsupported("fmt", fmt, "e4m3, e5m2"));
    }
    let block = match f.get("weight_block_size") {
        None => None,
        Some(v) => {
            let dims: Option<Vec<usize>> = v
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).filter_map(|d| usize::try_from(d).ok()).collect());
            match dims.as_deref() {
                Some(&[r, c]) if r > 0 && c > 0 => Some((r, c)),
                _ => return Err(f.unsupported("weight_block_size", v, "[rows, cols] of positive integers, or null")),
            }
        }
    };
    let scheme = f.str("activation_scheme")?.unwrap_or("dynamic");
    if scheme != "dynamic" {
        return Err(f.unsupported(
            "activation_scheme",
            scheme,
            "dynamic (qdrift computes activation scales at run time; stored input_scale values are not reproduced)",
        ));
    }
    // DeepSeek-V3.1's `scale_fmt: ue8m0` asks for power-of-two activation scales (vLLM's
    // `use_ue8m0`, DeepSeek's `act_quant(.., scale_fmt)`), which qdrift does not round.
    match f.get("scale_fmt") {
        None | Some(Value::Null) => {}
        Some(v) => {
            return Err(f.unsupported(
                "scale_fmt",
                v,
                "absent or null (activation scales amax/448; power-of-two ue8m0 scales are not modelled)",
            ));
        }
    }
    let granularity = match block {
        Some((_, c)) => ActivationGranularity::TokenGroup(c),
        None => ActivationGranularity::Tensor,
    };
    let activations = CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity };
    let name = match block {
        Some((r, c)) => format!("fp8 {fmt} block {r}x{c}"),
        None => format!("fp8 {fmt}"),
    };
    Ok((Method::Fp8 { block }, name, Some(activations)))
}

const CT_FORMATS: &str = "pack-quantized, int-quantized, naive-quantized, float-quantized";

fn ct_format(f: &Fields<'_>, key: &str) -> Result<Option<CtFormat>, LoadError> {
    Ok(match f.str(key)? {
        None => None,
        Some("pack-quantized") => Some(CtFormat::Packed),
        Some("int-quantized" | "naive-quantized") => Some(CtFormat::Int),
        Some("float-quantized") => Some(CtFormat::Float),
        Some(other) => return Err(f.unsupported(key, other, CT_FORMATS)),
    })
}

fn parse_compressed(f: &Fields<'_>) -> Result<Parsed, LoadError> {
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
    for pattern in &ignore {
        check_pattern(f, "ignore", pattern)?;
    }
    let Some(groups_obj) = f.get("config_groups").and_then(Value::as_object) else {
        return Err(LoadError::invalid(f.path, format!("{} is missing or not an object", f.field("config_groups"))));
    };
    let mut groups = Vec::new();
    let mut activations: Option<Option<CheckpointActivations>> = None;
    let mut names = Vec::new();
    for (name, g) in groups_obj {
        let g = Fields { path: f.path, prefix: f.field(&format!("config_groups.{name}")), v: g };
        let targets: Vec<String> = g
            .get("targets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| LoadError::invalid(f.path, format!("{} is not a list of strings", g.field("targets"))))?;
        for t in &targets {
            check_pattern(&g, "targets", t)?;
        }
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
                    act.map_or("none".into(), |a| a.to_string()),
                    &format!(
                        "one activation scheme for every group ({} elsewhere)",
                        prev.map_or("none".into(), |a| a.to_string())
                    ),
                ));
            }
            Some(_) => {}
        }
        names.push(ct_name(format, &weights));
        groups.push(CtGroup { targets, format, weights });
    }
    if groups.is_empty() {
        return Err(LoadError::invalid(f.path, format!("{} is empty", f.field("config_groups"))));
    }
    names.dedup();
    let summary = format!("compressed-tensors {}", names.join(" + "));
    Ok((Method::Compressed(Compressed { groups, ignore }), summary, activations.flatten()))
}

fn ct_name(format: CtFormat, w: &CtWeights) -> String {
    let format = match format {
        CtFormat::Packed => "pack-quantized",
        CtFormat::Int => "int-quantized",
        CtFormat::Float => "float-quantized",
    };
    let kind = if w.float { format!("fp{}", w.bits) } else { format!("int{}", w.bits) };
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
    if !symmetric && format == CtFormat::Packed && !matches!(strategy, Strategy::Channel | Strategy::Group(_)) {
        return Err(w.unsupported(
            "strategy",
            "tensor or block with symmetric false",
            "channel or group when asymmetric",
        ));
    }
    Ok(CtWeights { bits, float, symmetric, strategy })
}

fn parse_ct_activations(a: &Fields<'_>) -> Result<CheckpointActivations, LoadError> {
    let supported = "dynamic: true (qdrift computes activation scales at run time; static scales are not reproduced)";
    match a.get("dynamic") {
        Some(Value::Bool(true)) => {}
        other => return Err(a.unsupported("dynamic", other.map_or("(missing)".into(), Value::to_string), supported)),
    }
    if !a.flag("symmetric", true)? {
        return Err(a.unsupported("symmetric", false, "true (symmetric activations)"));
    }
    let bits = a.int("num_bits")?.unwrap_or(8);
    let format = match (a.str("type")?.unwrap_or("int"), bits) {
        ("int", 8) => ActivationFormat::Int8,
        ("float", 8) => ActivationFormat::Fp8E4M3,
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
    Ok(CheckpointActivations { format, granularity })
}

/// Refuses a `re:` pattern the small matcher below cannot run.
fn check_pattern(f: &Fields<'_>, key: &str, pattern: &str) -> Result<(), LoadError> {
    if let Some(re) = pattern.strip_prefix("re:")
        && re.strip_prefix('^').unwrap_or(re).chars().any(|c| "[](){}|+?^".contains(c))
    {
        return Err(f.unsupported(
            key,
            pattern,
            "module names, `Linear`, and `re:` patterns of literal characters, `.`, `.*`, `\\.`, a leading `^` and a final `$`",
        ));
    }
    Ok(())
}

/// Whether `pattern` (a module name, or `re:` as Python's `re.match`: anchored at the start)
/// names `module`.
fn matches(pattern: &str, module: &str) -> bool {
    let Some(re) = pattern.strip_prefix("re:") else {
        return pattern == module;
    };
    // `re.match` is anchored at the start already.
    let re = re.strip_prefix('^').unwrap_or(re);
    let (re, anchored_end) = match re.strip_suffix('$') {
        Some(r) => (r, true),
        None => (re, false),
    };
    // Tokens: a literal char, `.` (any), or `.*` (any run).
    #[derive(Clone, Copy)]
    enum Tok {
        Lit(char),
        Any,
        Star,
    }
    let mut toks = Vec::new();
    let mut chars = re.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => toks.push(Tok::Lit(chars.next().unwrap_or('\\'))),
            '.' if chars.peek() == Some(&'*') => {
                chars.next();
                toks.push(Tok::Star);
            }
            '.' => toks.push(Tok::Any),
            c => toks.push(Tok::Lit(c)),
        }
    }
    fn go(toks: &[Tok], s: &[char], anchored_end: bool) -> bool {
        match toks.split_first() {
            None => !anchored_end || s.is_empty(),
            Some((Tok::Star, rest)) => (0..=s.len()).any(|k| go(rest, &s[k..], anchored_end)),
            Some((Tok::Any, rest)) => !s.is_empty() && go(rest, &s[1..], anchored_end),
            Some((Tok::Lit(c), rest)) => s.first() == Some(c) && go(rest, &s[1..], anchored_end),
        }
    }
    let s: Vec<char> = module.chars().collect();
    go(&toks, &s, anchored_end)
}

impl HfQuant {
    /// The linear layer `module` (`model.layers.0.self_attn.q_proj`, `lm_head`) as f32
    /// `[out, in]`, in the checkpoint's row order; `None` when the folder has no such layer.
    ///
    /// # Shapes
    /// - returns `[out, inp]`.
    pub(crate) fn linear(
        &self,
        shards: &Shards,
        module: &str,
        out: usize,
        inp: usize,
    ) -> Result<Option<HostTensor>, LoadError> {
        if !self.stores_quantized(shards, module) {
            return shards.get(&format!("{module}.weight"), &[out, inp]);
        }
        let data = match &self.method {
            Method::Gptq { bits, group, v1 } => gptq(shards, module, *bits, *group, *v1, out, inp)?,
            Method::Awq { group } => awq(shards, module, *group, out, inp)?,
            Method::Compressed(c) => match c.scheme_of(module) {
                Some(g) => compressed(shards, module, g, out, inp)?,
                None => return shards.get(&format!("{module}.weight"), &[out, inp]),
            },
            Method::Fp8 { block } => fp8(shards, module, *block, out, inp)?,
        };
        let name = format!("{module}.weight");
        let path = shards.path_of(&name).unwrap_or(&self.path);
        crate::input::check_finite(path, &name, &data)?;
        HostTensor::new(vec![out, inp], data)
            .map(Some)
            .ok_or_else(|| LoadError::invalid(&self.path, format!("{module}: dequantized size does not match")))
    }
}

impl HfQuant {
    /// Whether the folder stores linear layer `module` quantized: GPTQ/AWQ when it has a
    /// `qweight`, compressed-tensors when a config group targets it and `ignore` does not, FP8
    /// when its `weight` is FP8 (quantizers skip some layers: `lm_head`, `modules_to_not_convert`).
    pub(crate) fn stores_quantized(&self, shards: &Shards, module: &str) -> bool {
        match &self.method {
            Method::Gptq { .. } | Method::Awq { .. } => shards.has(&format!("{module}.qweight")),
            Method::Compressed(c) => c.scheme_of(module).is_some(),
            Method::Fp8 { .. } => shards.dtype(&format!("{module}.weight")).is_some_and(is_fp8),
        }
    }
}

impl Compressed {
    /// The group quantizing `module`: not ignored, matched by a target (`Linear` matches every
    /// linear layer).
    fn scheme_of(&self, module: &str) -> Option<&CtGroup> {
        if self.ignore.iter().any(|p| matches(p, module)) {
            return None;
        }
        self.groups.iter().find(|g| g.targets.iter().any(|t| t == "Linear" || matches(t, module)))
    }
}

fn is_fp8(d: Dtype) -> bool {
    matches!(d, Dtype::F8_E4M3 | Dtype::F8_E5M2)
}

/// Refuses a dimension that is not a whole number of `pack` values.
fn check_divides(shards: &Shards, tensor: &str, what: &str, dim: usize, pack: usize) -> Result<(), LoadError> {
    if dim.is_multiple_of(pack) {
        return Ok(());
    }
    Err(LoadError::invalid(
        shards.path_of(tensor).unwrap_or(Path::new(".")),
        format!("tensor {tensor}: {what} {dim} is not a multiple of the {pack} codes an int32 packs"),
    ))
}

/// Unsigned `bits`-wide field `k` of `word` (low bits first).
fn field(word: i32, bits: u32, k: usize) -> i32 {
    ((word as u32 >> (bits as usize * k)) & ((1u32 << bits) - 1)) as i32
}

/// The number of groups and the group of each input: `g_idx` when stored, else `i / group`.
fn group_index(
    shards: &Shards,
    g_idx_name: &str,
    group: Option<usize>,
    inp: usize,
) -> Result<(usize, Vec<usize>), LoadError> {
    let size = group.unwrap_or(inp).max(1);
    let n_groups = inp.div_ceil(size);
    if !shards.has(g_idx_name) {
        return Ok((n_groups, (0..inp).map(|i| i / size).collect()));
    }
    let g_idx = shards.ints(g_idx_name, &[inp])?;
    let path = shards.path_of(g_idx_name).unwrap_or(Path::new("."));
    let idx = g_idx
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            usize::try_from(g).ok().filter(|&g| g < n_groups).ok_or_else(|| {
                LoadError::invalid(path, format!("tensor {g_idx_name}[{i}] = {g} is not a group in 0..{n_groups}"))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((n_groups, idx))
}

/// GPTQ (see the module doc).
///
/// # Shapes
/// - `qweight`: `[inp / pf, out]`, `qzeros`: `[groups, out / pf]`, `scales`: `[groups, out]`,
///   `g_idx`: `[inp]`; returns `[out, inp]`.
fn gptq(
    shards: &Shards,
    module: &str,
    bits: u32,
    group: Option<usize>,
    v1: bool,
    out: usize,
    inp: usize,
) -> Result<Vec<f32>, LoadError> {
    let pf = 32 / bits as usize;
    let (qw, qz, sc) = (format!("{module}.qweight"), format!("{module}.qzeros"), format!("{module}.scales"));
    check_divides(shards, &qw, "in_features", inp, pf)?;
    check_divides(shards, &qz, "out_features", out, pf)?;
    // qweight first: its shape confirms `inp` and `out` before anything their size is allocated.
    let qweight = shards.ints(&qw, &[inp / pf, out])?;
    let (n_groups, g_idx) = group_index(shards, &format!("{module}.g_idx"), group, inp)?;
    let qzeros = shards.ints(&qz, &[n_groups, out / pf])?;
    let scales = shards.floats(&sc, &[n_groups, out])?;
    let mut w = vec![0f32; out * inp];
    for (i, &g) in g_idx.iter().enumerate() {
        for o in 0..out {
            let q = field(qweight[(i / pf) * out + o], bits, i % pf);
            // v1: AutoGPTQ adds 1 and masks again, so a stored 2^bits − 1 is zero point 0.
            let z = (field(qzeros[g * (out / pf) + o / pf], bits, o % pf) + i32::from(v1)) & ((1 << bits) - 1);
            w[o * inp + i] = (q - z) as f32 * scales[g * out + o];
        }
    }
    Ok(w)
}

/// AWQ GEMM's `AWQ_REVERSE_ORDER`: output `8c + k` is nibble `REVERSE[k]` of packed column `c`.
const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// AWQ GEMM (see the module doc).
///
/// # Shapes
/// - `qweight`: `[inp, out / 8]`, `qzeros`: `[groups, out / 8]`, `scales`: `[groups, out]`;
///   returns `[out, inp]`.
fn awq(shards: &Shards, module: &str, group: Option<usize>, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
    let (qw, qz, sc) = (format!("{module}.qweight"), format!("{module}.qzeros"), format!("{module}.scales"));
    check_divides(shards, &qw, "out_features", out, 8)?;
    let size = group.unwrap_or(inp).max(1);
    let n_groups = inp.div_ceil(size);
    let qweight = shards.ints(&qw, &[inp, out / 8])?;
    let qzeros = shards.ints(&qz, &[n_groups, out / 8])?;
    let scales = shards.floats(&sc, &[n_groups, out])?;
    let mut w = vec![0f32; out * inp];
    for i in 0..inp {
        let g = i / size;
        for o in 0..out {
            let k = AWQ_REVERSE_ORDER[o % 8];
            let q = field(qweight[i * (out / 8) + o / 8], 4, k);
            let z = field(qzeros[g * (out / 8) + o / 8], 4, k);
            w[o * inp + i] = (q - z) as f32 * scales[g * out + o];
        }
    }
    Ok(w)
}

/// The scale (and zero point) grid of a compressed-tensors or FP8 weight.
///
/// # Shapes
/// `[out, inp]` weights; the grid is `[rows, cols]` as returned by [`Strategy::grid`].
impl Strategy {
    fn grid(self, out: usize, inp: usize) -> (usize, usize) {
        match self {
            Strategy::Tensor => (1, 1),
            Strategy::Channel => (out, 1),
            Strategy::Group(g) => (out, inp.div_ceil(g)),
            Strategy::Block(r, c) => (out.div_ceil(r), inp.div_ceil(c)),
        }
    }

    /// Index into the `[rows, cols]` grid of weight `(o, i)`; `g_idx` replaces `i / g` for
    /// act-order groups.
    fn index(self, o: usize, i: usize, cols: usize, g_idx: Option<&[usize]>) -> usize {
        match self {
            Strategy::Tensor => 0,
            Strategy::Channel => o,
            Strategy::Group(g) => o * cols + g_idx.map_or(i / g, |x| x[i]),
            Strategy::Block(r, c) => (o / r) * cols + i / c,
        }
    }

    /// The scale shapes a checkpoint may store for this grid.
    fn scale_shapes(self, out: usize, inp: usize) -> Vec<Vec<usize>> {
        let (r, c) = self.grid(out, inp);
        match self {
            Strategy::Tensor => vec![vec![1], vec![], vec![1, 1]],
            Strategy::Channel => vec![vec![out, 1], vec![out]],
            _ => vec![vec![r, c]],
        }
    }
}

/// compressed-tensors (see the module doc).
///
/// # Shapes
/// - `weight_packed`: `[out, ⌈inp/pf⌉]` I32 (pack-quantized) or `weight` `[out, inp]` (I8, FP8);
///   `weight_scale` and `weight_zero_point` on the strategy's grid; returns `[out, inp]`.
fn compressed(shards: &Shards, module: &str, g: &CtGroup, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
    let w = g.weights;
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
    if g.format == CtFormat::Float {
        let name = format!("{module}.weight");
        let (format, bytes) = shards.fp8(&name, &[out, inp])?;
        return Ok((0..out * inp).map(|k| format.decode(bytes[k]) * scales[scale_at(k / inp, k % inp)]).collect());
    }
    let offset = 1i32 << (w.bits - 1);
    let codes: Vec<i32> = if g.format == CtFormat::Packed {
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
        shards.ints_any(&format!("{module}.weight"), &[out, inp])?.into_iter().map(|q| q as i32).collect()
    };
    let zeros: Option<Vec<i32>> = if w.symmetric {
        None
    } else if g.format == CtFormat::Packed {
        let pf = 32 / w.bits as usize;
        let packed = shards.ints(&zp_name, &[rows.div_ceil(pf), cols])?;
        Some(
            (0..rows * cols)
                .map(|k| field(packed[(k / cols / pf) * cols + k % cols], w.bits, (k / cols) % pf) - offset)
                .collect(),
        )
    } else {
        let shapes = w.strategy.scale_shapes(out, inp);
        Some(shards.numbers_any(&zp_name, &shapes)?.into_iter().map(|z| z as i32).collect())
    };
    Ok((0..out * inp)
        .map(|k| {
            let s = scale_at(k / inp, k % inp);
            let z = zeros.as_ref().map_or(0, |z| z[s]);
            (codes[k] - z) as f32 * scales[s]
        })
        .collect())
}

/// FP8 with `weight_scale_inv` (see the module doc).
///
/// # Shapes
/// - `weight`: `[out, inp]` FP8; `weight_scale_inv`: `[⌈out/bh⌉, ⌈inp/bw⌉]`, `[out]`/`[out, 1]`
///   or `[1]`; returns `[out, inp]`.
fn fp8(
    shards: &Shards,
    module: &str,
    block: Option<(usize, usize)>,
    out: usize,
    inp: usize,
) -> Result<Vec<f32>, LoadError> {
    let scale_name = format!("{module}.weight_scale_inv");
    let strategy = match block {
        Some((r, c)) => Strategy::Block(r, c),
        None => {
            let n = shards.shape(&scale_name).map_or(1, |s| s.iter().product());
            if n == out && out != 1 { Strategy::Channel } else { Strategy::Tensor }
        }
    };
    let scales = shards.floats_any(&scale_name, &strategy.scale_shapes(out, inp))?;
    let (_, cols) = strategy.grid(out, inp);
    let (format, bytes) = shards.fp8(&format!("{module}.weight"), &[out, inp])?;
    Ok((0..out * inp).map(|k| format.decode(bytes[k]) * scales[strategy.index(k / inp, k % inp, cols, None)]).collect())
}

impl Shards {
    /// The FP8 format and bytes of `name`, which must have `shape`.
    fn fp8(&self, name: &str, shape: &[usize]) -> Result<(Ofp8, &[u8]), LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        let format = match raw.dtype {
            Dtype::F8_E4M3 => Ofp8::E4M3,
            Dtype::F8_E5M2 => Ofp8::E5M2,
            other => {
                return Err(LoadError::unsupported(
                    raw.path,
                    format!("tensor {name} dtype"),
                    format!("{other:?}"),
                    "F8_E4M3, F8_E5M2",
                ));
            }
        };
        Ok((format, raw.bytes))
    }

    /// An I32 tensor of exactly `shape`.
    fn ints(&self, name: &str, shape: &[usize]) -> Result<Vec<i32>, LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        if raw.dtype != Dtype::I32 {
            return Err(LoadError::unsupported(
                raw.path,
                format!("tensor {name} dtype"),
                format!("{:?}", raw.dtype),
                "I32",
            ));
        }
        Ok(raw.bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// An integer tensor (I8, I16, I32, I64, U8) of exactly `shape`, widened to i64.
    fn ints_any(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        int_values(raw.dtype, raw.bytes).ok_or_else(|| {
            LoadError::unsupported(
                raw.path,
                format!("tensor {name} dtype"),
                format!("{:?}", raw.dtype),
                "I8, I16, I32, I64, U8",
            )
        })
    }

    /// Zero points: any integer or float dtype, one of `shapes`.
    fn numbers_any(&self, name: &str, shapes: &[Vec<usize>]) -> Result<Vec<i64>, LoadError> {
        let raw = self.raw_shaped(name, shapes)?;
        if let Some(v) = int_values(raw.dtype, raw.bytes) {
            return Ok(v);
        }
        let f = crate::hf::to_f32(raw.dtype, raw.bytes)
            .map_err(|m| LoadError::invalid(raw.path, format!("tensor {name}: {m}")))?;
        f.iter()
            .map(|&z| {
                (z.fract() == 0.0 && z.abs() < 1e9).then_some(z as i64).ok_or_else(|| {
                    LoadError::invalid(raw.path, format!("tensor {name}: zero point {z} is not an integer"))
                })
            })
            .collect()
    }

    /// A float (F32/F16/BF16) tensor of exactly `shape`, as f32.
    fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        self.floats_any(name, &[shape.to_vec()])
    }

    /// A float (F32/F16/BF16) tensor with one of `shapes`, as f32; checked finite.
    fn floats_any(&self, name: &str, shapes: &[Vec<usize>]) -> Result<Vec<f32>, LoadError> {
        let raw = self.raw_shaped(name, shapes)?;
        let v = crate::hf::to_f32(raw.dtype, raw.bytes)
            .map_err(|m| LoadError::invalid(raw.path, format!("tensor {name}: {m}")))?;
        crate::input::check_finite(raw.path, name, &v)?;
        Ok(v)
    }

    /// `name`, present and with one of `shapes`.
    fn raw_shaped(&self, name: &str, shapes: &[Vec<usize>]) -> Result<crate::hf::Raw<'_>, LoadError> {
        let raw = self.raw(name).ok_or_else(|| {
            LoadError::invalid(
                self.first_path(),
                format!("tensor {name} is missing; the quantization config needs it with shape {}", show(shapes)),
            )
        })?;
        if !shapes.iter().any(|s| s.as_slice() == raw.shape) {
            return Err(LoadError::invalid(
                raw.path,
                format!("tensor {name} has shape {:?}; expected {}", raw.shape, show(shapes)),
            ));
        }
        Ok(raw)
    }
}

fn show(shapes: &[Vec<usize>]) -> String {
    shapes.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" or ")
}

/// Little-endian integers of an integer dtype, widened; `None` for other dtypes.
fn int_values(dtype: Dtype, bytes: &[u8]) -> Option<Vec<i64>> {
    Some(match dtype {
        Dtype::I8 => bytes.iter().map(|&b| i64::from(b as i8)).collect(),
        Dtype::U8 => bytes.iter().map(|&b| i64::from(b)).collect(),
        Dtype::I16 => bytes.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
        Dtype::I32 => bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn fields_are_low_bits_first() {
        let word = 0x7654_3210u32 as i32;
        assert_eq!((0..8).map(|k| field(word, 4, k)).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 7]);
        let word = 0x80FF_0102u32 as i32;
        assert_eq!((0..4).map(|k| field(word, 8, k)).collect::<Vec<_>>(), [2, 1, 255, 128]);
    }
}
