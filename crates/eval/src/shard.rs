//! Sharded evaluation: `qdrift eval --shard INDEX/COUNT` measures one shard's batches and writes
//! a [`Part`]; [`merge`] (`qdrift merge PARTS… --out DIR`) puts the parts' per-prompt traces back
//! in prompt order and computes the report, byte-identical to the unsharded run's.
//!
//! A part is a folder of two files, written in the section format of `container.rs` (as a saved
//! reference is):
//! - `part.json`: format and version, the shard, the indices of its prompts in the whole list,
//!   the report's context (model, workload, reference), each variant's header, each prompt's tail
//!   mass (top-K runs), and the data file's SHA-256 and sections;
//! - `traces.bin`: each variant's traces, `v{VARIANT}/{FIELD}`, `[prompts of the shard, H]`,
//!   and every floating-point number of `part.json` once more as exact f64 bits (`v{VARIANT}/floats`:
//!   bits per weight, then each tensor's SQNR, relative error and cosine; `tail`: each prompt's
//!   sum, largest value), which replace the JSON's on reading: `serde_json` without its
//!   `float_roundtrip` feature may parse a float one ulp off, and the merged report must be the
//!   unsharded run's bit for bit.
//!
//! **Invariant: the merge uses only what the parts hold, refuses parts of different runs (any
//! difference in context or variants), a missing or repeated shard or prompt, and computes the
//! statistics with exactly the unsharded run's code on exactly its traces.**

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::aggregate::Trace;
use crate::assemble::assemble_report;
use crate::config::Shard;
use crate::container::{Section, Sections, Writer, read_file, read_traces, write_traces};
use crate::error::EvalError;
use crate::identity::sha256_hex;
use crate::types::{Measurement, RunContext, TailSums, VariantHeader};

/// The format name in `part.json`.
pub const PART_FORMAT: &str = "qdrift-part";
/// The part layout version this build writes and reads.
pub const PART_VERSION: u32 = 1;
const PART_JSON_CAP: u64 = 64 << 20;
const TRACES_CAP: u64 = 16 << 30;

/// One shard's measurements.
pub struct Part {
    header: PartHeader,
    traces: Vec<Vec<Trace>>,
}

#[derive(Clone, Serialize, Deserialize)]
struct PartHeader {
    format: String,
    version: u32,
    shard: Shard,
    prompt_indices: Vec<usize>,
    context: RunContext,
    variants: Vec<VariantHeader>,
    /// Top-K runs: K and each of the shard's prompts' tail mass.
    tail: Option<(usize, Vec<TailSums>)>,
    data_bytes: u64,
    data_sha256: String,
    sections: Vec<Section>,
}

impl Part {
    /// A shard's part from its measurement.
    pub(crate) fn new(context: RunContext, shard: Shard, prompt_indices: Vec<usize>, m: Measurement) -> Part {
        let (variants, traces): (Vec<VariantHeader>, Vec<Vec<Trace>>) = m.variants.into_iter().unzip();
        Part {
            header: PartHeader {
                format: PART_FORMAT.into(),
                version: PART_VERSION,
                shard,
                prompt_indices,
                context,
                variants,
                tail: m.tail,
                data_bytes: 0,
                data_sha256: String::new(),
                sections: Vec::new(),
            },
            traces,
        }
    }

    /// The shard this part is.
    pub fn shard(&self) -> Shard {
        self.header.shard
    }

    /// Writes `part.json` and `traces.bin` into `dir` (an existing folder, e.g. a staging one).
    pub fn write(&self, dir: &Path) -> Result<(), EvalError> {
        let h = self.header.context.workload.horizons.last().copied().unwrap_or(0);
        let mut w = Writer::default();
        for (v, traces) in self.traces.iter().enumerate() {
            write_traces(&mut w, &format!("v{v}"), traces, h);
            w.f64s(&format!("v{v}/floats"), &header_floats(&self.header.variants[v]));
        }
        if let Some((_, sums)) = &self.header.tail {
            let floats: Vec<f64> = sums.iter().flat_map(|t| [t.sum, t.max]).collect();
            w.f64s("tail", &floats);
        }
        let mut header = self.header.clone();
        header.data_bytes = w.data.len() as u64;
        header.data_sha256 = sha256_hex(&w.data);
        header.sections = std::mem::take(&mut w.sections);
        let json = serde_json::to_vec_pretty(&header).map_err(|e| EvalError::Internal(e.to_string()))?;
        let traces = dir.join("traces.bin");
        std::fs::write(&traces, &w.data).map_err(EvalError::io(&traces))?;
        let part = dir.join("part.json");
        std::fs::write(&part, json).map_err(EvalError::io(&part))
    }

    /// Reads the part in `dir`, checking its format, checksum and sections.
    pub fn read(dir: &Path) -> Result<Part, EvalError> {
        let fail = |problem: String| EvalError::Part { path: dir.to_path_buf(), problem };
        let text = read_file(&dir.join("part.json"), PART_JSON_CAP, "part header").map_err(fail)?;
        let header: PartHeader =
            serde_json::from_slice(&text).map_err(|e| fail(format!("part.json is not a qdrift part: {e}")))?;
        if header.format != PART_FORMAT || header.version != PART_VERSION {
            return Err(fail(format!(
                "is {} version {}; this qdrift reads {PART_FORMAT} version {PART_VERSION}",
                header.format, header.version
            )));
        }
        let data = read_file(&dir.join("traces.bin"), TRACES_CAP.min(header.data_bytes), "part data").map_err(fail)?;
        if data.len() as u64 != header.data_bytes || sha256_hex(&data) != header.data_sha256 {
            return Err(fail(
                "traces.bin does not match its size and checksum in part.json (damaged or edited)".into(),
            ));
        }
        let listed = header.sections.clone();
        let sections = Sections::new(&listed, &data).map_err(fail)?;
        let mut header = header;
        for (v, variant) in header.variants.iter_mut().enumerate() {
            let floats = sections.f64s(&format!("v{v}/floats"), header_floats(variant).len()).map_err(fail)?;
            set_header_floats(variant, &floats);
        }
        if let Some((_, sums)) = &mut header.tail {
            let floats = sections.f64s("tail", 2 * sums.len()).map_err(fail)?;
            for (t, f) in sums.iter_mut().zip(floats.chunks_exact(2)) {
                (t.sum, t.max) = (f[0], f[1]);
            }
        }
        let n = header.prompt_indices.len();
        let h = header.context.workload.horizons.last().copied().unwrap_or(0);
        let traces = (0..header.variants.len())
            .map(|v| read_traces(&sections, &format!("v{v}"), n, h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        Ok(Part { header, traces })
    }
}

/// A header's floating-point numbers in store order: bits per weight, then each tensor's SQNR
/// (NaN for none), relative error and cosine.
fn header_floats(v: &VariantHeader) -> Vec<f64> {
    let mut f = vec![v.bits_per_weight];
    for t in &v.per_tensor_error {
        f.extend([t.sqnr_db.unwrap_or(f64::NAN), t.rel_frobenius, t.cosine]);
    }
    f
}

/// Puts [`header_floats`]' numbers back.
fn set_header_floats(v: &mut VariantHeader, f: &[f64]) {
    v.bits_per_weight = f[0];
    for (t, x) in v.per_tensor_error.iter_mut().zip(f[1..].chunks_exact(3)) {
        (t.sqnr_db, t.rel_frobenius, t.cosine) = (if x[0].is_nan() { None } else { Some(x[0]) }, x[1], x[2]);
    }
}

/// The report of a sharded run from all its parts (any order).
///
/// # Errors
/// [`EvalError::Merge`] when the parts come from different runs (context or variants differ),
/// disagree on the shard count, miss or repeat a shard, or do not cover every prompt once.
pub fn merge(parts: Vec<Part>) -> Result<qdrift_report::Report, EvalError> {
    let fail = |problem: String| EvalError::Merge(problem);
    let Some(first) = parts.first() else { return Err(fail("no parts given".into())) };
    let count = first.header.shard.count;
    let (context, variants, k) =
        (first.header.context.clone(), first.header.variants.clone(), first.header.tail.as_ref().map(|t| t.0));
    let mut seen = vec![false; count];
    for p in &parts {
        let s = p.header.shard;
        if s.count != count {
            return Err(fail(format!(
                "shard {s} is of a {}-shard run, shard {} of a {count}-shard one",
                s.count, first.header.shard
            )));
        }
        if std::mem::replace(&mut seen[s.index], true) {
            return Err(fail(format!("shard {s} is given twice")));
        }
        if p.header.context != context {
            return Err(fail(format!("shard {s} comes from another run (model, workload or reference differ)")));
        }
        if p.header.variants != variants || p.header.tail.as_ref().map(|t| t.0) != k {
            return Err(fail(format!("shard {s} evaluated other variants or another KL mode")));
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(fail(format!("shard {missing}/{count} is missing")));
    }
    let total = context.workload.prompts;
    let mut slot: Vec<Option<(usize, usize)>> = vec![None; total];
    for (pi, p) in parts.iter().enumerate() {
        for (j, &i) in p.header.prompt_indices.iter().enumerate() {
            match slot.get_mut(i) {
                Some(s @ None) => *s = Some((pi, j)),
                Some(Some(_)) => return Err(fail(format!("prompt {} appears in two shards", i + 1))),
                None => return Err(fail(format!("prompt index {i} is beyond the run's {total} prompts"))),
            }
        }
    }
    let order: Vec<(usize, usize)> = slot
        .iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| fail(format!("no shard holds prompt {}", i + 1))))
        .collect::<Result<_, _>>()?;
    let merged_variants = variants
        .iter()
        .enumerate()
        .map(|(v, header)| (header.clone(), order.iter().map(|&(pi, j)| parts[pi].traces[v][j].clone()).collect()))
        .collect();
    let tail = k.map(|k| {
        let sums = order.iter().filter_map(|&(pi, j)| parts[pi].header.tail.as_ref().and_then(|t| t.1.get(j)).copied());
        (k, sums.collect())
    });
    assemble_report(context, Measurement { variants: merged_variants, tail })
}
