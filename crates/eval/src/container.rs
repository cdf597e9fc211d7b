//! The container both saved references (`store.rs`) and shard parts (`shard.rs`) write their
//! arrays in: one data file of named little-endian arrays back to back ([`Writer`]), listed by
//! [`Section`]s (name, element type, shape, byte range) in the JSON file beside it, and read back
//! through [`Sections`], which checks every listed range against the data before anything is
//! used. Per-prompt [`Trace`]s have one encoding in it ([`write_traces`], [`read_traces`]). Its
//! files are read through [`read_file`] (`qdrift_io`: type checked before opening, size capped).

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::aggregate::Trace;

/// One array of a data file: its name, element type, shape and byte range.
#[derive(Clone, Serialize, Deserialize)]
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
        "f16" => Some(2),
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
const TRACE_F32: [TraceF32; 5] = [
    ("kld", |t| &t.kld),
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
}

/// Reads [`write_traces`]' sections back: `n` traces of `h` positions.
pub(crate) fn read_traces(s: &Sections<'_>, prefix: &str, n: usize, h: usize) -> Result<Vec<Trace>, String> {
    let [ref_tokens, var_tokens] = TRACE_U32.map(|(name, _)| s.u32s(&format!("{prefix}/{name}"), &[n, h]));
    let (mut ref_tokens, mut var_tokens) = (rows(ref_tokens?, h).into_iter(), rows(var_tokens?, h).into_iter());
    let mut f32s = Vec::with_capacity(TRACE_F32.len());
    for (name, _) in TRACE_F32 {
        f32s.push(rows(s.f32s(&format!("{prefix}/{name}"), &[n, h])?, h).into_iter());
    }
    let top1 = s.get(&format!("{prefix}/top1"), "u8", &[n, h])?.iter().map(|&b| b != 0).collect();
    let mut top1 = rows(top1, h).into_iter();
    let mut next = |i: usize| f32s[i].next().unwrap_or_default();
    Ok((0..n)
        .map(|_| Trace {
            ref_tokens: ref_tokens.next().unwrap_or_default(),
            var_tokens: var_tokens.next().unwrap_or_default(),
            kld: next(0),
            logp_ref: next(1),
            logp_var: next(2),
            ref_entropy: next(3),
            logp_ref_on_var_text: next(4),
            top1: top1.next().unwrap_or_default(),
        })
        .collect())
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
    pub fn new(sections: &'a [Section], data: &'a [u8]) -> Result<Sections<'a>, String> {
        let mut by_name = HashMap::new();
        for s in sections {
            let size =
                element_bytes(&s.dtype).ok_or_else(|| format!("section {}: unknown type {}", s.name, s.dtype))?;
            let count = s.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let end = s.offset.checked_add(s.bytes);
            match (count.and_then(|c| c.checked_mul(size)), end) {
                (Some(b), Some(end)) if b == s.bytes && end <= data.len() as u64 => {}
                _ => return Err(format!("section {}: shape {:?} and byte range do not fit the data", s.name, s.shape)),
            }
            let bytes = &data[s.offset as usize..(s.offset + s.bytes) as usize];
            if by_name.insert(s.name.as_str(), (s, bytes)).is_some() {
                return Err(format!("section {} appears twice", s.name));
            }
        }
        Ok(Sections { by_name })
    }

    /// Every section: its name, listing and bytes, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a Section, &'a [u8])> + '_ {
        self.by_name.iter().map(|(name, (s, bytes))| (*name, *s, *bytes))
    }

    pub fn get(&self, name: &str, dtype: &str, shape: &[usize]) -> Result<&'a [u8], String> {
        let (s, bytes) = self.by_name.get(name).ok_or_else(|| format!("section {name} is missing"))?;
        if s.dtype != dtype || s.shape != shape {
            return Err(format!("section {name} is {} {:?}, expected {dtype} {shape:?}", s.dtype, s.shape));
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
