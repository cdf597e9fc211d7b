//! The container both saved references (`store.rs`) and shard parts (`shard.rs`) write their
//! arrays in: one data file of named little-endian arrays back to back ([`Writer`]), listed by
//! [`Section`]s (name, element type, shape, byte range) in the JSON file beside it, and read back
//! through [`Sections`], which checks every listed range against the data before anything is
//! used. Per-prompt [`Trace`]s have one encoding in it ([`write_traces`], [`read_traces`]). Its
//! files are read through [`read_file`] (`qdrift_io`: type checked before opening, size capped).
//!
//! **Sealing.** The data file ends with a SHA-256 ([`seal`]) over the JSON file's bytes *and* the
//! data before it, so that no field of the JSON (a shard index, a count, a section's range) and no
//! number of the data can be edited without the reader noticing ([`unseal`]): the JSON is
//! trusted only as far as the digest in the data file vouches for it, and then every value is
//! still range-checked before it is used ([`check_traces`], [`Sections::new`]).

use std::collections::HashMap;
use std::path::Path;

use qdrift_io::elide;
use qdrift_score::{TOP_K, TopKAgreement};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::trace::{RoutingTrace, Trace};

/// Bytes of the digest that ends a data file ([`seal`]).
pub(crate) const SEAL_BYTES: u64 = 32;

/// The seal of a container of kind `format` (`qdrift-part`, `qdrift-reference`): SHA-256 over the
/// format name, the JSON file's length (u64 little-endian) and bytes, then the data before the
/// seal. Written as the data file's last 32 bytes.
pub fn seal(format: &str, json: &[u8], data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(format.as_bytes());
    h.update([0]);
    h.update((json.len() as u64).to_le_bytes());
    h.update(json);
    h.update(data);
    h.finalize().into()
}

/// Splits a data file read back into its data and checks its seal against `json` (the JSON
/// file's bytes as read): `json_name` and `data_name` name the two files in the message.
pub(crate) fn unseal<'a>(format: &str, json: &[u8], file: &'a [u8], names: (&str, &str)) -> Result<&'a [u8], String> {
    let (json_name, data_name) = names;
    let split = file.len().checked_sub(SEAL_BYTES as usize);
    let Some((data, digest)) = split.map(|at| file.split_at(at)) else {
        return Err(format!("{data_name} is too short to end with its checksum (damaged or cut short)"));
    };
    if seal(format, json, data)[..] != *digest {
        return Err(format!(
            "{json_name} and {data_name} do not match their checksum (damaged, edited, or from two different saves)"
        ));
    }
    Ok(data)
}

/// The format name and version of a store's or part's JSON file, read before the rest so that a
/// file of an older layout is refused with what to do (`redo`) rather than a parse error.
pub(crate) fn check_format(
    json: &[u8],
    json_name: &str,
    (format, version): (&str, u32),
    redo: &str,
) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Probe {
        format: String,
        version: u32,
    }
    let probe: Probe = serde_json::from_slice(json).map_err(|e| format!("{json_name} is not a {format} file: {e}"))?;
    if probe.format != format {
        return Err(format!("{json_name} is a {} file, not a {format} one", elide(&probe.format)));
    }
    if probe.version != version {
        return Err(format!(
            "{json_name} is {format} version {}, which this qdrift does not read (it reads version {version}): {redo}",
            probe.version
        ));
    }
    Ok(())
}

/// One array of a data file: its name, element type, shape and byte range.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Section {
    name: String,
    /// `u8`, `u32`, `f16`, `f32` or `f64`.
    pub dtype: String,
    /// Its dimensions, outermost first.
    pub shape: Vec<usize>,
    offset: u64,
    bytes: u64,
}

fn element_bytes(dtype: &str) -> Option<u64> {
    match dtype {
        "u8" => Some(1),
        "f16" | "bf16" => Some(2),
        "u32" | "f32" => Some(4),
        "f64" => Some(8),
        _ => None,
    }
}

/// A data file being assembled from named little-endian arrays.
#[derive(Default)]
pub(crate) struct Writer {
    pub data: Vec<u8>,
    pub sections: Vec<Section>,
}

impl Writer {
    pub fn push(&mut self, name: String, dtype: &str, shape: Vec<usize>, bytes: &[u8]) {
        self.sections.push(Section {
            name,
            dtype: dtype.into(),
            shape,
            offset: self.data.len() as u64,
            bytes: bytes.len() as u64,
        });
        self.data.extend_from_slice(bytes);
    }

    pub fn u32s(&mut self, name: &str, shape: Vec<usize>, values: impl Iterator<Item = u32>) {
        let bytes: Vec<u8> = values.flat_map(u32::to_le_bytes).collect();
        self.push(name.into(), "u32", shape, &bytes);
    }

    pub fn f32s<'a>(&mut self, name: &str, shape: Vec<usize>, values: impl Iterator<Item = &'a f32>) {
        let bytes: Vec<u8> = values.flat_map(|v| v.to_le_bytes()).collect();
        self.push(name.into(), "f32", shape, &bytes);
    }

    pub fn f64s(&mut self, name: &str, values: &[f64]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.push(name.into(), "f64", vec![values.len()], &bytes);
    }
}

/// The per-position fields of traces, in store order: name and accessor.
type TraceU32 = (&'static str, fn(&Trace) -> &Vec<u32>);
type TraceF32 = (&'static str, fn(&Trace) -> &Vec<f32>);
const TRACE_U32: [TraceU32; 2] = [("ref_tokens", |t| &t.ref_tokens), ("var_tokens", |t| &t.var_tokens)];
const TRACE_F32: [TraceF32; 7] = [
    ("kld", |t| &t.kld),
    ("kld_reverse", |t| &t.kld_reverse),
    ("accept", |t| &t.accept),
    ("logp_ref", |t| &t.logp_ref),
    ("logp_var", |t| &t.logp_var),
    ("ref_entropy", |t| &t.ref_entropy),
    ("logp_ref_on_var_text", |t| &t.logp_ref_on_var_text),
];

/// Writes traces as sections `PREFIX/FIELD`, each `[traces, h]` (`top1` as bytes): the one
/// trace encoding of stores (the noise floor) and shard parts (every variant).
pub(crate) fn write_traces(w: &mut Writer, prefix: &str, traces: &[Trace], h: usize) {
    let n = traces.len();
    for (name, field) in TRACE_U32 {
        w.u32s(&format!("{prefix}/{name}"), vec![n, h], traces.iter().flat_map(|t| field(t).iter().copied()));
    }
    for (name, field) in TRACE_F32 {
        w.f32s(&format!("{prefix}/{name}"), vec![n, h], traces.iter().flat_map(field));
    }
    let top1: Vec<u8> = traces.iter().flat_map(|t| t.top1.iter().map(|&b| u8::from(b))).collect();
    w.push(format!("{prefix}/top1"), "u8", vec![n, h], &top1);
    let top_k: Vec<u8> = traces
        .iter()
        .flat_map(|t| t.top_k.iter().flat_map(|a| a.shared.into_iter().chain([a.ref_top1_rank])))
        .collect();
    w.push(format!("{prefix}/top_k"), "u8", vec![n, h, TOP_K_BYTES], &top_k);
    write_routing(w, prefix, traces, h);
}

/// The sections [`write_traces`] writes for traces without routing.
pub(crate) const TRACE_SECTIONS: usize = 11;

/// Bytes per position of the `top_k` section: the [`TOP_K`] overlaps, then the rank.
const TOP_K_BYTES: usize = TOP_K + 1;

/// The routing fields of traces as bytes `[traces, L·h]`, in section order: name and accessor.
type RoutingBytes = (&'static str, fn(&RoutingTrace) -> Vec<u8>);
const ROUTING_BYTES: [RoutingBytes; 4] = [
    ("routing_shared", |r| r.shared.clone()),
    ("routing_top1", |r| r.top1.iter().map(|&b| u8::from(b)).collect()),
    ("routing_shared_gen", |r| r.shared_on_var_text.clone()),
    ("routing_top1_gen", |r| r.top1_on_var_text.iter().map(|&b| u8::from(b)).collect()),
];

/// Writes the traces' routing, when they have one (every trace of a run with experts does):
/// `PREFIX/routing` (u32: experts, top-k, then the layers) and the four `[traces, L·h]` byte
/// arrays of [`ROUTING_BYTES`].
fn write_routing(w: &mut Writer, prefix: &str, traces: &[Trace], h: usize) {
    let Some(first) = traces.first().and_then(|t| t.routing.as_ref()) else { return };
    let meta: Vec<u32> = [first.experts, first.top_k].into_iter().chain(first.layers.iter().copied()).collect();
    w.u32s(&format!("{prefix}/routing"), vec![meta.len()], meta.into_iter());
    let width = first.layers.len() * h;
    for (name, field) in ROUTING_BYTES {
        let bytes: Vec<u8> = traces.iter().flat_map(|t| t.routing.as_ref().map(field).unwrap_or_default()).collect();
        w.push(format!("{prefix}/{name}"), "u8", vec![traces.len(), width], &bytes);
    }
}

/// Reads [`write_routing`]'s sections back, if there are any: `n` routing traces of `h`
/// positions per layer, and how many sections that took.
fn read_routing(
    s: &Sections<'_>,
    prefix: &str,
    n: usize,
    h: usize,
) -> Result<(Vec<Option<RoutingTrace>>, usize), String> {
    let name = format!("{prefix}/routing");
    let Some(&[len]) = s.shape(&name) else { return Ok((vec![None; n], 0)) };
    let meta = s.u32s(&name, &[len])?;
    let [experts, top_k, layers @ ..] = meta.as_slice() else {
        return Err(format!("section {name} holds {} numbers, not experts, top-k and the layers", meta.len()));
    };
    let width = layers.len() * h;
    let mut fields = Vec::with_capacity(ROUTING_BYTES.len());
    for (field, _) in ROUTING_BYTES {
        let bytes = s.get(&format!("{prefix}/{field}"), "u8", &[n, width])?;
        fields.push(rows(bytes.to_vec(), width).into_iter());
    }
    let flags = |v: Vec<u8>| v.into_iter().map(|b| b == 1).collect::<Vec<bool>>();
    let mut traces = Vec::with_capacity(n);
    for _ in 0..n {
        let mut next = |i: usize| fields[i].next().unwrap_or_default();
        let (shared, top1, shared_gen, top1_gen) = (next(0), next(1), next(2), next(3));
        if let Some(b) = top1.iter().chain(&top1_gen).find(|&&b| b > 1) {
            return Err(format!("section {prefix}/routing_top1: a byte is {b}, not 0 or 1"));
        }
        traces.push(Some(RoutingTrace {
            experts: *experts,
            top_k: *top_k,
            layers: layers.to_vec(),
            shared,
            top1: flags(top1),
            shared_on_var_text: shared_gen,
            top1_on_var_text: flags(top1_gen),
        }));
    }
    Ok((traces, 1 + ROUTING_BYTES.len()))
}

/// Reads [`write_traces`]' sections back: `n` traces of `h` positions (`top1` bytes 0 or 1), and
/// how many sections they took.
pub(crate) fn read_traces(s: &Sections<'_>, prefix: &str, n: usize, h: usize) -> Result<(Vec<Trace>, usize), String> {
    let [ref_tokens, var_tokens] = TRACE_U32.map(|(name, _)| s.u32s(&format!("{prefix}/{name}"), &[n, h]));
    let (mut ref_tokens, mut var_tokens) = (rows(ref_tokens?, h).into_iter(), rows(var_tokens?, h).into_iter());
    let mut f32s = Vec::with_capacity(TRACE_F32.len());
    for (name, _) in TRACE_F32 {
        f32s.push(rows(s.f32s(&format!("{prefix}/{name}"), &[n, h])?, h).into_iter());
    }
    let top1 = s.get(&format!("{prefix}/top1"), "u8", &[n, h])?;
    if let Some(i) = top1.iter().position(|&b| b > 1) {
        return Err(format!("section {prefix}/top1: byte {i} is {}, not 0 or 1", top1[i]));
    }
    let mut top1 = rows(top1.iter().map(|&b| b == 1).collect(), h).into_iter();
    let top_k: Vec<TopKAgreement> = s
        .get(&format!("{prefix}/top_k"), "u8", &[n, h, TOP_K_BYTES])?
        .chunks_exact(TOP_K_BYTES)
        .map(|b| {
            let mut shared = [0; TOP_K];
            shared.copy_from_slice(&b[..TOP_K]);
            TopKAgreement { shared, ref_top1_rank: b[TOP_K] }
        })
        .collect();
    let mut top_k = rows(top_k, h).into_iter();
    let mut next = |i: usize| f32s[i].next().unwrap_or_default();
    let (routing, routing_sections) = read_routing(s, prefix, n, h)?;
    let traces = routing
        .into_iter()
        .map(|routing| Trace {
            ref_tokens: ref_tokens.next().unwrap_or_default(),
            var_tokens: var_tokens.next().unwrap_or_default(),
            kld: next(0),
            kld_reverse: next(1),
            accept: next(2),
            logp_ref: next(3),
            logp_var: next(4),
            ref_entropy: next(5),
            logp_ref_on_var_text: next(6),
            top1: top1.next().unwrap_or_default(),
            top_k: top_k.next().unwrap_or_default(),
            routing,
        })
        .collect();
    Ok((traces, TRACE_SECTIONS + routing_sections))
}

/// How far f32 rounding may take a quantity past its mathematical bound (a KL divergence or an
/// entropy below 0, a log-probability above 0): the device sums them in f32 over the vocabulary.
pub(crate) const ROUNDING: f32 = 1e-3;

/// The range of a per-position float: what a run can produce.
#[derive(Clone, Copy)]
pub(crate) enum Bound {
    /// A KL divergence or an entropy: finite, ≥ 0 (up to [`ROUNDING`]).
    NonNegative,
    /// A log-probability: finite, ≤ 0 (up to [`ROUNDING`]).
    LogProb,
    /// A probability: finite, in `[0, 1]` (up to [`ROUNDING`]).
    Probability,
}

impl Bound {
    pub fn holds(self, v: f32) -> bool {
        v.is_finite()
            && match self {
                Bound::NonNegative => v >= -ROUNDING,
                Bound::LogProb => v <= ROUNDING,
                Bound::Probability => (-ROUNDING..=1.0 + ROUNDING).contains(&v),
            }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Bound::NonNegative => "finite and ≥ 0",
            Bound::LogProb => "a finite log-probability (≤ 0)",
            Bound::Probability => "a probability in [0, 1]",
        }
    }
}

/// The first value of one prompt's `values` outside `bound`: `section NAME: prompt P position T
/// is V, not …` (`prompt`: the prompt's number, from 1).
pub(crate) fn check_floats(name: &str, prompt: usize, values: &[f32], bound: Bound) -> Result<(), String> {
    match values.iter().position(|&v| !bound.holds(v)) {
        Some(i) => {
            Err(format!("section {name}: prompt {prompt} position {i} is {}, not {}", values[i], bound.describe()))
        }
        None => Ok(()),
    }
}

/// The first position of one prompt's top-K agreements that no run writes: an overlap above its
/// K, an unknown overlap below a known one, or a rank above [`TOP_K`] (`prompt`: its number,
/// from 1). (Not checked against the top-1 agreement: on the device, the top-K follows the
/// log-probabilities and the top-1 the logits, which may order a near-tie differently.)
fn check_top_k(name: &str, prompt: usize, top_k: &[TopKAgreement]) -> Result<(), String> {
    match top_k.iter().position(|a| !a.is_valid()) {
        Some(i) => Err(format!(
            "section {name}: prompt {prompt} position {i} is overlaps {:?} and rank {}, which no run writes",
            top_k[i].shared, top_k[i].ref_top1_rank
        )),
        None => Ok(()),
    }
}

/// The first token of one prompt's `tokens` not below `vocab` (`prompt`: its number, from 1).
pub(crate) fn check_tokens(name: &str, prompt: usize, tokens: &[u32], vocab: usize) -> Result<(), String> {
    match tokens.iter().position(|&t| t as usize >= vocab) {
        Some(i) => Err(format!(
            "section {name}: prompt {prompt} position {i} is token {}, beyond the vocabulary of {vocab}",
            tokens[i]
        )),
        None => Ok(()),
    }
}

/// Checks traces as [`write_traces`] writes them under `prefix`: every trace `h` positions
/// long, its tokens below `vocab`, its continuation the reference's (`reference`, one per trace),
/// and every number in the range a run produces. The writers check what they write with it too,
/// so that a store or part a run writes is always one the readers accept.
pub(crate) fn check_traces(
    prefix: &str,
    traces: &[Trace],
    h: usize,
    vocab: usize,
    reference: &[Vec<u32>],
) -> Result<(), String> {
    for (i, t) in traces.iter().enumerate() {
        let lens = [t.ref_tokens.len(), t.var_tokens.len(), t.kld.len(), t.logp_ref.len(), t.top1.len()];
        let more = [t.logp_var.len(), t.ref_entropy.len(), t.logp_ref_on_var_text.len(), t.kld_reverse.len()];
        let more = more.into_iter().chain([t.accept.len(), t.top_k.len()]);
        if lens.into_iter().chain(more).any(|l| l != h) {
            return Err(format!("{prefix}: prompt {} does not hold {h} positions", i + 1));
        }
        if reference.get(i) != Some(&t.ref_tokens) {
            return Err(format!("section {prefix}/ref_tokens: prompt {} is not the reference's continuation", i + 1));
        }
        for (name, tokens) in [("ref_tokens", &t.ref_tokens), ("var_tokens", &t.var_tokens)] {
            check_tokens(&format!("{prefix}/{name}"), i + 1, tokens, vocab)?;
        }
        let floats = [
            ("kld", &t.kld, Bound::NonNegative),
            ("kld_reverse", &t.kld_reverse, Bound::NonNegative),
            ("accept", &t.accept, Bound::Probability),
            ("logp_ref", &t.logp_ref, Bound::LogProb),
            ("logp_var", &t.logp_var, Bound::LogProb),
            ("ref_entropy", &t.ref_entropy, Bound::NonNegative),
            ("logp_ref_on_var_text", &t.logp_ref_on_var_text, Bound::LogProb),
        ];
        for (name, values, bound) in floats {
            check_floats(&format!("{prefix}/{name}"), i + 1, values, bound)?;
        }
        check_top_k(&format!("{prefix}/top_k"), i + 1, &t.top_k)?;
        if t.routing.is_some() != traces[0].routing.is_some() {
            let has = |r: bool| if r { "has routing" } else { "has none" };
            let (this, first) = (has(t.routing.is_some()), has(traces[0].routing.is_some()));
            return Err(format!("{prefix}: prompt {} {this}, prompt 1 {first}", i + 1));
        }
        if let Some(r) = &t.routing {
            check_routing(&format!("{prefix}/routing"), i + 1, r, h)?;
        }
    }
    Ok(())
}

/// One prompt's routing as a run writes it: `1 ≤ k ≤ experts`, layers ascending, every field
/// `[L, h]`, at most `k` shared experts, and a shared top-1 expert only where some expert is
/// shared.
fn check_routing(name: &str, prompt: usize, r: &RoutingTrace, h: usize) -> Result<(), String> {
    if r.top_k == 0 || r.top_k > r.experts || r.layers.is_empty() || !r.layers.windows(2).all(|p| p[0] < p[1]) {
        return Err(format!(
            "section {name}: {} experts, top-{}, layers {:?} are not a run's (1 ≤ k ≤ experts, layers ascending)",
            r.experts, r.top_k, r.layers
        ));
    }
    let width = r.layers.len() * h;
    let lens = [r.shared.len(), r.top1.len(), r.shared_on_var_text.len(), r.top1_on_var_text.len()];
    if lens.iter().any(|&l| l != width) {
        return Err(format!("section {name}: prompt {prompt} does not hold {} layers × {h} positions", r.layers.len()));
    }
    for (shared, top1) in [(&r.shared, &r.top1), (&r.shared_on_var_text, &r.top1_on_var_text)] {
        let bad = shared.iter().zip(top1).position(|(&s, &same)| u32::from(s) > r.top_k || (same && s == 0));
        if let Some(j) = bad {
            return Err(format!(
                "section {name}: prompt {prompt} layer {} position {} shares {} of {} experts with top-1 {}",
                r.layers[j / h.max(1)],
                j % h.max(1),
                shared[j],
                r.top_k,
                if top1[j] { "equal" } else { "different" }
            ));
        }
    }
    Ok(())
}

/// Reads one file of a store or part, only a regular file of at most `cap` bytes (checked
/// before it is opened, [`qdrift_io::read_capped`]); `what` names its kind. The error names the
/// file by its name, for a message that names its folder first.
pub(crate) fn read_file(path: &Path, cap: u64, what: &'static str) -> Result<Vec<u8>, String> {
    qdrift_io::read_capped(path, cap, what).map_err(|e| {
        let message = e.to_string();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // The message starts with the whole path; the folder is named by the caller.
        match message.strip_prefix(&path.display().to_string()) {
            Some(rest) => format!("{name}{rest}"),
            None => message,
        }
    })
}

/// A data file's sections, checked against it.
pub(crate) struct Sections<'a> {
    by_name: HashMap<&'a str, (&'a Section, &'a [u8])>,
}

impl<'a> Sections<'a> {
    /// The sections of `data`: each of a known type, its bytes its shape's, and all of them back
    /// to back from the start to the end of `data` in the order listed (as [`Writer`] lays them
    /// out), each name once.
    pub fn new(sections: &'a [Section], data: &'a [u8]) -> Result<Sections<'a>, String> {
        let mut by_name = HashMap::new();
        let mut at = 0u64;
        for s in sections {
            let name = elide(&s.name);
            let size =
                element_bytes(&s.dtype).ok_or_else(|| format!("section {name}: unknown type {}", elide(&s.dtype)))?;
            let count = s.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let end = s.offset.checked_add(s.bytes);
            match (count.and_then(|c| c.checked_mul(size)), end) {
                (Some(b), Some(end)) if b == s.bytes && end <= data.len() as u64 && s.offset == at => at = end,
                _ => {
                    return Err(format!(
                        "section {name}: shape {:?} and byte range {}+{} do not fit the data (its sections lie back to back, the next at {at})",
                        s.shape, s.offset, s.bytes
                    ));
                }
            }
            let bytes = &data[s.offset as usize..end.unwrap_or_default() as usize];
            if by_name.insert(s.name.as_str(), (s, bytes)).is_some() {
                return Err(format!("section {name} appears twice"));
            }
        }
        if at != data.len() as u64 {
            return Err(format!("the sections end at byte {at}, the data at {}", data.len()));
        }
        Ok(Sections { by_name })
    }

    /// How many sections there are.
    pub fn count(&self) -> usize {
        self.by_name.len()
    }

    /// Refuses sections besides the `expected` a reader used (all names are distinct, so equal
    /// counts mean the same sections).
    pub fn all_used(&self, expected: usize) -> Result<(), String> {
        if self.count() != expected {
            return Err(format!("holds {} sections, a run writes {expected}", self.count()));
        }
        Ok(())
    }

    /// The shape of section `name`, if there is one.
    pub fn shape(&self, name: &str) -> Option<&'a [usize]> {
        self.by_name.get(name).map(|(s, _)| s.shape.as_slice())
    }

    pub fn get(&self, name: &str, dtype: &str, shape: &[usize]) -> Result<&'a [u8], String> {
        let (s, bytes) = self.by_name.get(name).ok_or_else(|| format!("section {name} is missing"))?;
        if s.dtype != dtype || s.shape != shape {
            return Err(format!("section {name} is {} {:?}, expected {dtype} {shape:?}", elide(&s.dtype), s.shape));
        }
        Ok(bytes)
    }

    pub fn u32s(&self, name: &str, shape: &[usize]) -> Result<Vec<u32>, String> {
        Ok(self
            .get(name, "u32", shape)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub fn f64s(&self, name: &str, len: usize) -> Result<Vec<f64>, String> {
        Ok(self
            .get(name, "f64", &[len])?
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }

    pub fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
        Ok(self
            .get(name, "f32", shape)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Rows of `h` values, one per prompt.
pub(crate) fn rows<T: Clone>(flat: Vec<T>, h: usize) -> Vec<Vec<T>> {
    if h == 0 { Vec::new() } else { flat.chunks(h).map(<[T]>::to_vec).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's or part's file is refused by its type before it is opened (a named pipe would
    /// block the read forever), and the message names it by its name for the folder's message.
    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_by_name_without_opening_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("manifest.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
        let e = read_file(&fifo, 1 << 20, "store manifest").expect_err("refused");
        assert_eq!(e, "manifest.json: the store manifest is a named pipe (FIFO), not a regular file");
    }

    /// The seal covers every byte of the JSON and of the data: an edit of either alone is
    /// refused, and so is a seal recomputed for another format.
    #[test]
    fn an_edit_of_either_file_breaks_the_seal() {
        let (json, data) = (br#"{"shard": {"index": 0, "count": 2}}"#.to_vec(), vec![1u8, 2, 3, 4]);
        let mut file = data.clone();
        file.extend_from_slice(&seal("qdrift-part", &json, &data));
        let names = ("part.json", "traces.bin");
        assert_eq!(unseal("qdrift-part", &json, &file, names).expect("sealed"), &data[..]);
        let edited = String::from_utf8(json.clone()).expect("utf-8").replace("\"index\": 0", "\"index\": 1");
        let e = unseal("qdrift-part", edited.as_bytes(), &file, names).expect_err("edited JSON");
        assert!(e.contains("part.json and traces.bin do not match their checksum"), "{e}");
        let mut flipped = file.clone();
        flipped[1] ^= 1;
        assert!(unseal("qdrift-part", &json, &flipped, names).is_err());
        assert!(unseal("qdrift-reference", &json, &file, names).is_err());
        assert!(unseal("qdrift-part", &json, &file[..10], names).expect_err("short").contains("too short"));
    }

    #[test]
    fn an_old_version_or_another_format_is_refused_saying_what_to_do() {
        let check = |json: &str| check_format(json.as_bytes(), "part.json", ("qdrift-part", 2), "run it again");
        assert!(check(r#"{"format": "qdrift-part", "version": 2, "other": 1}"#).is_ok());
        let e = check(r#"{"format": "qdrift-part", "version": 1}"#).expect_err("old");
        assert_eq!(
            e,
            "part.json is qdrift-part version 1, which this qdrift does not read (it reads version 2): run it again"
        );
        let e = check(r#"{"format": "qdrift-reference", "version": 2}"#).expect_err("other format");
        assert!(e.contains("is a qdrift-reference file, not a qdrift-part one"), "{e}");
        assert!(check("[1]").expect_err("not a part").starts_with("part.json is not a qdrift-part file"));
    }

    fn section(name: &str, shape: Vec<usize>, offset: u64, bytes: u64) -> Section {
        Section { name: name.into(), dtype: "u8".into(), shape, offset, bytes }
    }

    /// Sections lie back to back from the start to the end of the data, each name once, and
    /// sizes that overflow are refused rather than wrapped.
    #[test]
    fn sections_must_tile_the_data_in_order() {
        let data = [0u8; 6];
        let ok = [section("a", vec![2], 0, 2), section("b", vec![2, 2], 2, 4)];
        assert_eq!(Sections::new(&ok, &data).expect("tiles").count(), 2);
        let gap = [section("a", vec![2], 0, 2), section("b", vec![2], 4, 2)];
        let err = |sections: &[Section]| Sections::new(sections, &data).map(|_| ()).expect_err("refused");
        assert!(err(&gap).contains("section b"));
        let short = [section("a", vec![2], 0, 2)];
        assert!(err(&short).contains("end at byte 2"));
        let twice = [section("a", vec![3], 0, 3), section("a", vec![3], 3, 3)];
        assert!(err(&twice).contains("twice"));
        let huge = [section("a", vec![usize::MAX, 2], 0, 6)];
        assert!(Sections::new(&huge, &data).is_err());
        let wraps = [section("a", vec![2], u64::MAX, 2)];
        assert!(Sections::new(&wraps, &data).is_err());
    }

    fn trace(kld: f32, token: u32) -> Trace {
        let mut t = Trace::new(vec![1, 2], vec![1, token]);
        t.kld = vec![0.0, kld];
        t
    }

    /// A value no run writes is refused naming the section, prompt and position.
    #[test]
    fn trace_values_outside_their_range_are_refused() {
        let reference = [vec![1, 2], vec![1, 2]];
        assert!(check_traces("v1", &[trace(0.0, 2), trace(-1e-6, 2)], 2, 10, &reference).is_ok());
        let e = check_traces("v1", &[trace(0.0, 2), trace(f32::NAN, 2)], 2, 10, &reference).expect_err("NaN");
        assert_eq!(e, "section v1/kld: prompt 2 position 1 is NaN, not finite and ≥ 0");
        let e = check_traces("v1", &[trace(-0.5, 2)], 2, 10, &reference).expect_err("negative");
        assert!(e.contains("-0.5"), "{e}");
        let e = check_traces("v1", &[trace(0.0, 2), trace(0.0, 10)], 2, 10, &reference).expect_err("token");
        assert_eq!(e, "section v1/var_tokens: prompt 2 position 1 is token 10, beyond the vocabulary of 10");
        let e = check_traces("v1", &[trace(0.0, 2)], 2, 10, &[vec![1, 3]]).expect_err("another continuation");
        assert!(e.contains("not the reference's continuation"), "{e}");
        let mut logp = trace(0.0, 2);
        logp.logp_var[0] = 0.5;
        assert!(check_traces("v1", &[logp], 2, 10, &reference).expect_err("logp").contains("logp_var"));
    }

    /// A trace of 2 positions with the routing of 8 experts, top-2, in blocks 1 and 3.
    fn routed(kld: f32) -> Trace {
        let mut t = trace(kld, 2);
        t.routing = Some(RoutingTrace {
            experts: 8,
            top_k: 2,
            layers: vec![1, 3],
            shared: vec![2, 1, 0, 2],
            top1: vec![true, false, false, true],
            shared_on_var_text: vec![2, 2, 1, 1],
            top1_on_var_text: vec![true, true, false, true],
        });
        t
    }

    /// Routing travels in five sections beside a trace's eight and comes back equal; traces
    /// without routing take none; values no run writes are refused naming layer and position.
    #[test]
    fn routing_round_trips_and_impossible_routes_are_refused() {
        for traces in [vec![routed(0.5), routed(0.25)], vec![trace(0.5, 2), trace(0.25, 2)]] {
            let mut w = Writer::default();
            write_traces(&mut w, "v0", &traces, 2);
            let sections = Sections::new(&w.sections, &w.data).expect("sections");
            let (back, used) = read_traces(&sections, "v0", 2, 2).expect("read back");
            assert_eq!(back, traces);
            assert_eq!(used, sections.count());
            assert_eq!(used, TRACE_SECTIONS + if traces[0].routing.is_some() { 5 } else { 0 });
        }
        let reference = [vec![1, 2], vec![1, 2]];
        assert!(check_traces("v1", &[routed(0.0), routed(0.0)], 2, 10, &reference).is_ok());
        let mut too_many = routed(0.0);
        too_many.routing.as_mut().expect("routing").shared[1] = 3;
        let e = check_traces("v1", &[too_many], 2, 10, &reference).expect_err("3 of 2");
        assert_eq!(e, "section v1/routing: prompt 1 layer 1 position 1 shares 3 of 2 experts with top-1 different");
        let mut none_shared = routed(0.0);
        let r = none_shared.routing.as_mut().expect("routing");
        (r.shared_on_var_text[2], r.top1_on_var_text[2]) = (0, true);
        let e = check_traces("v1", &[none_shared], 2, 10, &reference).expect_err("same top-1, nothing shared");
        assert_eq!(e, "section v1/routing: prompt 1 layer 3 position 0 shares 0 of 2 experts with top-1 equal");
        let e = check_traces("v1", &[routed(0.0), trace(0.0, 2)], 2, 10, &reference).expect_err("mixed");
        assert_eq!(e, "v1: prompt 2 has none, prompt 1 has routing");
    }

    #[test]
    fn a_file_over_its_cap_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("traces.bin");
        std::fs::write(&path, [0u8; 9]).expect("writes");
        assert_eq!(read_file(&path, 9, "part data").expect("within the cap"), [0u8; 9]);
        let e = read_file(&path, 8, "part data").expect_err("refused");
        assert_eq!(e, "traces.bin: the part data is larger than its limit (more than 8 bytes)");
    }
}
