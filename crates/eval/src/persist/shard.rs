//! Sharded evaluation: `qdrift eval --shard INDEX/COUNT` measures one shard's batches and writes
//! a [`Part`]; [`merge`] (`qdrift merge PARTS… --out DIR`) puts the parts' per-prompt traces back
//! in prompt order and computes the report, byte-identical to the unsharded run's.
//!
//! A part is a folder of two files, written in the section format of `container.rs` (as a saved
//! reference is):
//! - `part.json`: format and version, the shard, the indices of its prompts in the whole list,
//!   the report's context (model, workload, reference), each variant's header, each prompt's tail
//!   mass (top-K runs), and the data's size and sections;
//! - `traces.bin`: each variant's traces, `v{VARIANT}/{FIELD}`, `[prompts of the shard, H]`,
//!   and every floating-point number of `part.json` once more as exact f64 bits (`v{VARIANT}/floats`:
//!   bits per weight, then each tensor's SQNR, relative error and cosine; `tail`: each prompt's
//!   sum, largest value), which replace the JSON's on reading: `serde_json` without its
//!   `float_roundtrip` feature may parse a float one ulp off, and the merged report must be the
//!   unsharded run's bit for bit. It ends with the seal (`container::seal`): a SHA-256 over
//!   `part.json`'s bytes and the data, so that neither file can be edited alone.
//!
//! Reading checks the format and version, the seal, then every value against what a run writes
//! ([`PartHeader::check`], `container::check_traces`): the shard against the workload's batches,
//! the prompt indices against the shard rule ([`Shard::prompt_indices`]), every count against
//! the lists it sizes, every number in its range.
//!
//! **Invariant: the merge uses only what the parts hold, refuses parts of different runs (any
//! difference in context or variants), a missing or repeated shard or prompt, and computes the
//! statistics with exactly the unsharded run's code on exactly its traces; nothing is allocated
//! from a part's numbers before they are checked against what was read.**

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::assemble::report::assemble_report;
use crate::check::config::MAX_RESAMPLES;
use crate::check::config::Shard;
use crate::error::EvalError;
use crate::persist::container::{
    SEAL_BYTES, Section, Sections, Writer, check_format, check_traces, read_file, read_traces, seal, unseal,
    write_traces,
};
use crate::trace::Trace;
use crate::types::{Measurement, RunContext, TailSums, VariantHeader};

/// The format name in `part.json`.
pub const PART_FORMAT: &str = "qdrift-part";
/// The part layout version this build writes and reads (2: `part.json` sealed with the data;
/// 3: traces with the reverse KL, the acceptance and the top-K agreement).
pub const PART_VERSION: u32 = 3;
const PART_JSON_CAP: u64 = 64 << 20;
const TRACES_CAP: u64 = 16 << 30;
/// What to do with a part of another version.
const REDO: &str = "run its shard again with this qdrift (`qdrift eval --shard`)";

/// One shard's measurements.
pub struct Part {
    header: PartHeader,
    traces: Vec<Vec<Trace>>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartHeader {
    format: String,
    version: u32,
    shard: Shard,
    prompt_indices: Vec<usize>,
    context: RunContext,
    variants: Vec<VariantHeader>,
    /// Top-K runs: K and each of the shard's prompts' tail mass.
    tail: Option<(usize, Vec<TailSums>)>,
    /// Bytes of `traces.bin` before its seal.
    data_bytes: u64,
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
                sections: Vec::new(),
            },
            traces,
        }
    }

    /// The shard this part is.
    pub fn shard(&self) -> Shard {
        self.header.shard
    }

    /// Writes `part.json` and `traces.bin` into `dir` (an existing folder).
    ///
    /// # Errors
    /// A value no reader would accept (a non-finite KL divergence from non-finite logits), or
    /// a file that cannot be written ([`EvalError::Output`] naming `dir`).
    pub fn write(&self, dir: &Path) -> Result<(), EvalError> {
        let fail = |problem: String| EvalError::Output { path: dir.to_path_buf(), problem };
        self.check_values().map_err(|e| fail(format!("cannot write the part: {e}")))?;
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
        header.sections = std::mem::take(&mut w.sections);
        let json = serde_json::to_vec_pretty(&header).map_err(|e| fail(format!("cannot encode part.json: {e}")))?;
        let digest = seal(PART_FORMAT, &json, &w.data);
        w.data.extend_from_slice(&digest);
        for (name, bytes) in [("traces.bin", &w.data), ("part.json", &json)] {
            std::fs::write(dir.join(name), bytes).map_err(|e| fail(format!("cannot write {name}: {e}")))?;
        }
        Ok(())
    }

    /// Reads the part in `dir`, checking its format, seal, sections and every value.
    ///
    /// # Errors
    /// [`EvalError::Part`] naming `dir`, the file and the field.
    pub fn read(dir: &Path) -> Result<Part, EvalError> {
        let fail = |problem: String| EvalError::Part { path: dir.to_path_buf(), problem };
        let json = read_file(&dir.join("part.json"), PART_JSON_CAP, "part header").map_err(fail)?;
        check_format(&json, "part.json", (PART_FORMAT, PART_VERSION), REDO).map_err(fail)?;
        let mut header: PartHeader =
            serde_json::from_slice(&json).map_err(|e| fail(format!("part.json is not a qdrift part: {e}")))?;
        let cap = header.data_bytes.checked_add(SEAL_BYTES).map_or(TRACES_CAP, |b| b.min(TRACES_CAP));
        let file = read_file(&dir.join("traces.bin"), cap, "part data").map_err(fail)?;
        let data = unseal(PART_FORMAT, &json, &file, ("part.json", "traces.bin")).map_err(fail)?;
        if data.len() as u64 != header.data_bytes {
            return Err(fail(format!(
                "part.json: data_bytes is {}, traces.bin holds {}",
                header.data_bytes,
                data.len()
            )));
        }
        header.check().map_err(|e| fail(format!("part.json: {e}")))?;
        let listed = header.sections.clone();
        let sections = Sections::new(&listed, data).map_err(|e| fail(format!("traces.bin: {e}")))?;
        let traces = header.read_data(&sections).map_err(|e| fail(format!("traces.bin: {e}")))?;
        let part = Part { header, traces };
        part.check_values().map_err(|e| fail(format!("traces.bin: {e}")))?;
        Ok(part)
    }

    /// Every number of the part in the range a run produces: traces ([`check_traces`]), the
    /// variants' header numbers (as the report's validation wants them) and the tail sums.
    fn check_values(&self) -> Result<(), String> {
        let h = &self.header;
        let horizon = h.context.workload.horizons.last().copied().unwrap_or(0);
        let vocab = h.context.model.shape.vocab_size;
        let reference: Vec<Vec<u32>> =
            self.traces.first().map(|t| t.iter().map(|t| t.ref_tokens.clone()).collect()).unwrap_or_default();
        if self.traces.len() != h.variants.len() {
            return Err(format!("{} variants, {} sets of traces", h.variants.len(), self.traces.len()));
        }
        for (v, traces) in self.traces.iter().enumerate() {
            if traces.len() != h.prompt_indices.len() {
                return Err(format!("v{v}: {} traces for {} prompts", traces.len(), h.prompt_indices.len()));
            }
            check_traces(&format!("v{v}"), traces, horizon, vocab, &reference)?;
            let variant = &h.variants[v];
            let floats = header_floats(variant);
            let bad = |x: f64, nonnegative: bool| !x.is_finite() || (nonnegative && x < 0.0);
            if bad(variant.bits_per_weight, true)
                || variant.per_tensor_error.iter().any(|t| {
                    bad(t.rel_frobenius, true) || bad(t.cosine, false) || t.sqnr_db.is_some_and(|s| bad(s, false))
                })
            {
                return Err(format!("section v{v}/floats: a number is not finite or out of its range: {floats:?}"));
            }
        }
        if let Some((_, sums)) = &h.tail {
            // Each position's tail mass is at most 1 (up to rounding of its logarithm).
            let most = 1.0 + 2.0 * f64::from(crate::persist::container::ROUNDING);
            if let Some((i, t)) = sums.iter().enumerate().find(|(_, t)| {
                t.positions != horizon
                    || !(0.0..=most * horizon as f64).contains(&t.sum)
                    || !(0.0..=most).contains(&t.max)
            }) {
                return Err(format!(
                    "section tail: prompt {} has tail mass sum {} and largest {} over {} positions, not a run's ({horizon} positions, each ≤ 1)",
                    i + 1,
                    t.sum,
                    t.max,
                    t.positions
                ));
            }
        }
        Ok(())
    }
}

impl PartHeader {
    /// The header's own consistency, before any number sizes anything: the shard against the
    /// workload's batches, the prompt indices those the shard rule gives, the counts against the
    /// lists they describe.
    fn check(&self) -> Result<(), String> {
        let w = &self.context.workload;
        let prompts = w.prompts;
        if prompts == 0 || prompts != w.eval_set.prompts.len() {
            return Err(format!(
                "workload.prompts is {prompts}, but eval_set lists {} prompt ids",
                w.eval_set.prompts.len()
            ));
        }
        if w.bootstrap_resamples == 0 || w.bootstrap_resamples > MAX_RESAMPLES {
            return Err(format!(
                "workload.bootstrap_resamples is {}, not between 1 and {MAX_RESAMPLES} (--resamples)",
                w.bootstrap_resamples
            ));
        }
        if w.batch_size == 0 || w.batch_size > prompts {
            return Err(format!("workload.batch_size is {}, not between 1 and its {prompts} prompts", w.batch_size));
        }
        if w.horizons.first().is_none_or(|&h| h == 0) || !w.horizons.windows(2).all(|p| p[0] < p[1]) {
            return Err(format!("workload.horizons {:?} are not ascending horizons ≥ 1", w.horizons));
        }
        let batches = prompts.div_ceil(w.batch_size);
        self.shard.check(batches, w.batch_size).map_err(|e| format!("shard {e}"))?;
        let mut expected = self.shard.prompt_indices(prompts, w.batch_size);
        let mut given = self.prompt_indices.iter();
        for j in 0.. {
            match (expected.next(), given.next()) {
                (None, None) => break,
                (a, b) if a == b.copied() => {}
                (a, b) => {
                    let show = |x: Option<usize>| x.map_or("nothing".to_string(), |i| format!("prompt index {i}"));
                    return Err(format!(
                        "prompt_indices[{j}] is {}, where shard {} of {prompts} prompts in batches of {} holds {}",
                        show(b.copied()),
                        self.shard,
                        w.batch_size,
                        show(a)
                    ));
                }
            }
        }
        if self.variants.is_empty() {
            return Err("lists no variants (the noise floor is always one)".into());
        }
        if self.context.model.shape.vocab_size == 0 {
            return Err("model.shape.vocab_size is 0".into());
        }
        if let Some((k, sums)) = &self.tail
            && (*k == 0 || sums.len() != self.prompt_indices.len())
        {
            return Err(format!(
                "tail holds K = {k} and {} prompts' sums; the shard has {} prompts and K ≥ 1",
                sums.len(),
                self.prompt_indices.len()
            ));
        }
        Ok(())
    }

    /// The traces and the exact floats of the data file, which must hold exactly the sections a
    /// run writes.
    fn read_data(&mut self, sections: &Sections<'_>) -> Result<Vec<Vec<Trace>>, String> {
        for (v, variant) in self.variants.iter_mut().enumerate() {
            let floats = sections.f64s(&format!("v{v}/floats"), header_floats(variant).len())?;
            set_header_floats(variant, &floats);
        }
        if let Some((_, sums)) = &mut self.tail {
            let floats = sections.f64s("tail", 2 * sums.len())?;
            for (t, f) in sums.iter_mut().zip(floats.chunks_exact(2)) {
                (t.sum, t.max) = (f[0], f[1]);
            }
        }
        let n = self.prompt_indices.len();
        let h = self.context.workload.horizons.last().copied().unwrap_or(0);
        let mut traces = Vec::with_capacity(self.variants.len());
        let mut used = usize::from(self.tail.is_some());
        for v in 0..self.variants.len() {
            let (t, sections_used) = read_traces(sections, &format!("v{v}"), n, h)?;
            traces.push(t);
            // The traces' sections and the floats.
            used += sections_used + 1;
        }
        sections.all_used(used)?;
        Ok(traces)
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
