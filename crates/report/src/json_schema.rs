//! [`report_json_schema`]: `report.json` (schema version [`SCHEMA_VERSION`]) as a JSON Schema (draft 2020-12), the
//! file `schema/report.schema.json` holds.
//!
//! Built here rather than written by hand so that the per-horizon metrics come from the registry
//! ([`METRICS`]: name, range, placement, distribution) and cannot drift from it; the rest follows
//! the types of `schema.rs` field by field. A test compares it with the committed file, and CI
//! validates both example reports and a freshly written one against the file with an independent
//! validator (`check-jsonschema`).
//!
//! The schema is strict: every object denies keys it does not name, so a field a run writes and
//! the schema lacks fails CI. Readers of reports should still ignore keys they do not know (the
//! version rule on [`SCHEMA_VERSION`]: adding an optional field keeps the version).

use serde_json::{Value, json};

use crate::SCHEMA_VERSION;
use crate::metrics::{EXCESS_KEY, METRICS, Metric, PER_PROMPT_KEY, Placement, Range};

/// The identifier the schema gives itself (`$id`).
pub const REPORT_SCHEMA_ID: &str = "https://github.com/qdrift/qdrift/schema/report.schema.json";

/// A closed object: `properties`, the `required` ones, and no other key.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

/// A number in `range`.
fn number(range: Range) -> Value {
    match range {
        Range::Unit => json!({ "type": "number", "minimum": 0, "maximum": 1 }),
        Range::NonNegative => json!({ "type": "number", "minimum": 0 }),
        Range::Positive => json!({ "type": "number", "exclusiveMinimum": 0 }),
        Range::Any => json!({ "type": "number" }),
    }
}

fn count() -> Value {
    json!({ "type": "integer", "minimum": 0 })
}

fn text() -> Value {
    json!({ "type": "string" })
}

fn sha256() -> Value {
    json!({ "type": "string", "pattern": "^[0-9a-f]{64}$" })
}

fn array(items: Value) -> Value {
    json!({ "type": "array", "items": items })
}

/// `[a, b]`: a pair, as serde writes a tuple.
fn pair(a: Value, b: Value) -> Value {
    json!({ "type": "array", "prefixItems": [a, b], "items": false, "minItems": 2 })
}

/// One metric's [`Estimate`](crate::Estimate): `mean`, the distribution's four keys when the
/// metric has one, `ci95`; every number in the metric's range.
fn estimate(m: &Metric) -> Value {
    let n = number(m.range);
    let mut properties = json!({
        "mean": n,
        "ci95": { "type": "array", "items": n, "minItems": 2, "maxItems": 2 },
    });
    let mut required = vec!["mean", "ci95"];
    if m.tail.is_some() {
        for key in ["median", "p90", "p99", "max"] {
            properties[key] = n.clone();
            required.push(key);
        }
    }
    let mut schema = object(properties, &required);
    schema["description"] = json!(m.description);
    schema
}

/// A horizon's metrics, from the registry: `tokens`, every metric by name (the required ones
/// required), the excess metrics under [`EXCESS_KEY`], the per-prompt values under
/// [`PER_PROMPT_KEY`].
fn horizon() -> Value {
    let mut properties = json!({ "tokens": { "type": "integer", "minimum": 1 } });
    let mut required = vec!["tokens"];
    let mut excess = json!({});
    for m in METRICS {
        match m.placement {
            Placement::Required => {
                properties[m.name] = estimate(m);
                required.push(m.name);
            }
            Placement::Optional => properties[m.name] = estimate(m),
            Placement::Excess { key } => excess[key] = estimate(m),
        }
    }
    properties[EXCESS_KEY] = object(excess, &[]);
    let mut per_prompt = json!({});
    for m in METRICS.iter().filter(|m| m.per_prompt.is_some()) {
        per_prompt[m.name] = array(number(Range::Any));
    }
    let mut per_prompt = object(per_prompt, &[]);
    per_prompt["description"] = json!(
        "For each metric whose estimate follows from one value per prompt, those values in prompt order (what \
         `qdrift compare` pairs)."
    );
    properties[PER_PROMPT_KEY] = per_prompt;
    object(properties, &required)
}

/// What a position in `report.json` counts from, where it holds one.
const ZERO_BASED: &str = "Generated-token positions count from 0 here (0 is the first generated token); the \
                          Markdown, HTML and terminal renderings count them from 1, as their charts do.";

fn first_divergence() -> Value {
    object(
        json!({
            "median": { "type": ["integer", "null"], "minimum": 0, "description": ZERO_BASED },
            "survival": array(pair(count(), number(Range::Unit))),
            "censored": count(),
            "positions": { "type": "array", "items": count(), "description": ZERO_BASED },
        }),
        &["median", "survival", "censored", "positions"],
    )
}

fn variant() -> Value {
    let unit_series = array(number(Range::Unit));
    object(
        json!({
            "name": text(),
            "scheme": text(),
            "recipe": object(
                json!({ "weights": text(), "activations": { "type": ["string", "null"] }, "kv_cache": { "type": ["string", "null"] }, "calibration_prompts": { "type": "integer", "minimum": 0 } }),
                &["weights", "activations", "kv_cache"],
            ),
            "path": text(),
            "sha256": sha256(),
            "files": array(object(json!({ "name": text(), "sha256": sha256() }), &["name", "sha256"])),
            "kind": { "enum": ["scheme", "checkpoint", "noise_floor"] },
            "compute_dtype": text(),
            "bits_per_weight": number(Range::NonNegative),
            "weight_bytes": count(),
            "horizons": { "type": "array", "items": { "$ref": "#/$defs/horizon" } },
            "failure": text(),
            "different_model": text(),
            "first_divergence": { "$ref": "#/$defs/first_divergence" },
            "per_position": object(
                json!({ "token_match": unit_series, "kld": array(number(Range::NonNegative)), "top1_agreement": unit_series }),
                &["token_match", "kld", "top1_agreement"],
            ),
            "entropy_strata": array(object(
                json!({
                    "entropy_lo": number(Range::NonNegative),
                    "entropy_hi": number(Range::NonNegative),
                    "positions": count(),
                    "kld_mean": { "type": ["number", "null"], "minimum": 0 },
                    "top1_agreement": { "type": ["number", "null"], "minimum": 0, "maximum": 1 },
                }),
                &["entropy_lo", "entropy_hi", "positions", "kld_mean", "top1_agreement"],
            )),
            "per_tensor_error": array(object(
                json!({
                    "tensor": text(),
                    "sqnr_db": { "type": ["number", "null"] },
                    "rel_frobenius": number(Range::NonNegative),
                    "cosine": { "type": "number", "minimum": -1, "maximum": 1 },
                }),
                &["tensor", "sqnr_db", "rel_frobenius", "cosine"],
            )),
            "routing": routing(),
        }),
        &[
            "name",
            "kind",
            "compute_dtype",
            "bits_per_weight",
            "weight_bytes",
            "horizons",
            "first_divergence",
            "per_position",
            "entropy_strata",
            "per_tensor_error",
        ],
    )
}

fn routing() -> Value {
    let estimate = |range| {
        let n = number(range);
        object(
            json!({ "mean": n, "ci95": { "type": "array", "items": n, "minItems": 2, "maxItems": 2 } }),
            &["mean", "ci95"],
        )
    };
    object(
        json!({
            "experts": { "type": "integer", "minimum": 1 },
            "top_k": { "type": "integer", "minimum": 1 },
            "first_flip": { "$ref": "#/$defs/first_divergence" },
            "flip_by_position": array(number(Range::Unit)),
            "layers": array(object(
                json!({
                    "layer": count(),
                    "flip_rate": estimate(Range::Unit),
                    "expert_overlap": estimate(Range::Unit),
                    "first_flip_median": { "type": ["integer", "null"], "minimum": 0, "description": ZERO_BASED },
                }),
                &["layer", "flip_rate", "expert_overlap", "first_flip_median"],
            )),
        }),
        &["experts", "top_k", "first_flip", "flip_by_position", "layers"],
    )
}

fn model() -> Value {
    let shape = ["layers", "dim", "hidden_dim", "heads", "kv_heads", "vocab_size"];
    let mut shape_properties = json!({});
    for key in shape {
        shape_properties[key] = count();
    }
    object(
        json!({
            "path": text(),
            "sha256": { "type": "string", "pattern": "^([0-9a-f]{64})?$" },
            "architecture": text(),
            "parameters": count(),
            "synthetic": { "type": "boolean" },
            "format": text(),
            "shape": object(shape_properties, &shape),
            "stop_token_id": count(),
            "stored_dtype": text(),
        }),
        &["path", "sha256", "architecture", "parameters", "synthetic", "format", "shape"],
    )
}

fn workload() -> Value {
    object(
        json!({
            "backend": { "enum": ["wgpu", "cpu"] },
            "adapter": text(),
            "compute_dtype": text(),
            "prompts": { "type": "integer", "minimum": 1 },
            "horizons": { "type": "array", "items": { "type": "integer", "minimum": 1 }, "minItems": 1 },
            "batch_size": { "type": "integer", "minimum": 1 },
            "seed": count(),
            "eval_set": object(
                json!({ "path": text(), "sha256": sha256(), "prompts": array(text()) }),
                &["path", "sha256", "prompts"],
            ),
            "qdrift_version": text(),
            "bootstrap_resamples": { "type": "integer", "minimum": 1 },
            "chat_template": { "type": "boolean" },
            "quantize_router": { "type": "boolean" },
        }),
        &[
            "backend",
            "adapter",
            "compute_dtype",
            "prompts",
            "horizons",
            "batch_size",
            "seed",
            "eval_set",
            "qdrift_version",
            "bootstrap_resamples",
            "chat_template",
        ],
    )
}

fn reference() -> Value {
    let exact = object(json!({ "method": { "const": "exact" } }), &["method"]);
    let top_k = object(
        json!({
            "method": { "const": "top_k_tail" },
            "top_k": { "type": "integer", "minimum": 1 },
            "tail_mass_max": number(Range::Unit),
            "tail_mass_mean": number(Range::Unit),
        }),
        &["method", "top_k", "tail_mass_max", "tail_mass_mean"],
    );
    object(
        json!({
            "name": text(),
            "compute_dtype": text(),
            "weight_bytes": count(),
            "self_perplexity": array(pair(count(), number(Range::Positive))),
            "kl": { "oneOf": [exact, top_k] },
        }),
        &["name", "compute_dtype", "weight_bytes", "self_perplexity"],
    )
}

/// `report.json` of [`SCHEMA_VERSION`] as a JSON Schema (draft 2020-12).
pub fn report_json_schema() -> Value {
    let mut schema = object(
        json!({
            "schema_version": { "const": SCHEMA_VERSION },
            "model": model(),
            "workload": workload(),
            "reference": reference(),
            "variants": { "type": "array", "items": { "$ref": "#/$defs/variant" }, "minItems": 1 },
        }),
        &["schema_version", "model", "workload", "reference", "variants"],
    );
    let header = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": REPORT_SCHEMA_ID,
        "title": format!("qdrift report.json, schema version {SCHEMA_VERSION}"),
        "description": "What `qdrift eval` and `qdrift merge` write. Generated from qdrift-report's types and metric registry (crates/report/src/json_schema.rs); do not edit by hand. Strict: every object denies keys it does not name, so that qdrift's CI catches a field the schema lacks; a reader should still ignore keys it does not know, since adding an optional field keeps the schema version.",
    });
    let mut out = header.as_object().cloned().unwrap_or_default();
    if let Some(body) = schema.as_object_mut() {
        out.append(body);
    }
    out.insert(
        "$defs".into(),
        json!({ "horizon": horizon(), "first_divergence": first_divergence(), "variant": variant() }),
    );
    Value::Object(out)
}
