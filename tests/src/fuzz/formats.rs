//! Mutations that know where a binary format keeps its counts, lengths, types and offsets.

use serde_json::Value;

use super::Rng;
use super::mutate::{self, interesting, put_le};

/// An integer field of a file: where it is and how wide.
#[derive(Clone, Copy)]
struct Field {
    at: usize,
    width: usize,
}

/// The layout of a GGUF file as far as it parses: the integer fields worth mutating (header,
/// key/value and tensor-info fields apart from the string lengths inside arrays, which would
/// outnumber them), the byte ranges of whole key/value and tensor-info entries, and where the
/// tensor data starts.
#[derive(Default)]
struct GgufMap {
    fields: Vec<Field>,
    item_fields: Vec<Field>,
    kv_entries: Vec<(usize, usize)>,
    tensor_entries: Vec<(usize, usize)>,
    data_start: Option<usize>,
}

/// A lenient GGUF walker: records what it passes and stops at the first thing it cannot read.
struct Walker<'a> {
    bytes: &'a [u8],
    at: usize,
    map: GgufMap,
}

impl Walker<'_> {
    fn int(&mut self, width: usize) -> Option<u64> {
        self.int_in(width, false)
    }

    /// An integer; `item` says it belongs to an array item (kept apart, see [`GgufMap`]).
    fn int_in(&mut self, width: usize, item: bool) -> Option<u64> {
        let b = self.bytes.get(self.at..self.at + width)?;
        let mut v = [0u8; 8];
        v[..width].copy_from_slice(b);
        let fields = if item { &mut self.map.item_fields } else { &mut self.map.fields };
        fields.push(Field { at: self.at, width });
        self.at += width;
        Some(u64::from_le_bytes(v))
    }

    fn string(&mut self, item: bool) -> Option<()> {
        let len = usize::try_from(self.int_in(8, item)?).ok()?;
        self.bytes.get(self.at..self.at.checked_add(len)?)?;
        self.at += len;
        Some(())
    }

    /// A value of GGUF type `ty` (arrays of scalars are skipped without recording every item).
    fn value(&mut self, ty: u64, depth: usize) -> Option<()> {
        let width = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return self.string(depth > 0),
            9 if depth == 0 => {
                let item = self.int(4)?;
                let count = self.int(8)?;
                for _ in 0..count.min(1 << 20) {
                    self.value(item, depth + 1)?;
                }
                return Some(());
            }
            _ => return None,
        };
        self.bytes.get(self.at..self.at + width)?;
        if depth == 0 {
            self.map.fields.push(Field { at: self.at, width });
        }
        self.at += width;
        Some(())
    }

    fn walk(mut self) -> GgufMap {
        self.walk_entries();
        self.map
    }

    fn walk_entries(&mut self) -> Option<()> {
        self.at = 4;
        self.int(4)?;
        let n_tensors = self.int(8)?;
        let n_kv = self.int(8)?;
        for _ in 0..n_kv.min(1 << 16) {
            let start = self.at;
            self.string(false)?;
            let ty = self.int(4)?;
            self.value(ty, 0)?;
            self.map.kv_entries.push((start, self.at));
        }
        for _ in 0..n_tensors.min(1 << 16) {
            let start = self.at;
            self.string(false)?;
            let dims = self.int(4)?;
            for _ in 0..dims.min(8) {
                self.int(8)?;
            }
            self.int(4)?;
            self.int(8)?;
            self.map.tensor_entries.push((start, self.at));
        }
        self.map.data_start = Some(self.at.next_multiple_of(32));
        Some(())
    }
}

/// GGUF: 1–3 header fields (counts, string lengths, value and tensor types, dims, offsets) set to
/// edge values, now and then a key/value or tensor entry removed or duplicated (with or without
/// fixing its count), a NaN among the weights, then text and byte edits.
pub fn gguf(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let map = Walker { bytes: seed, at: 0, map: GgufMap::default() }.walk();
    let mut out = seed.to_vec();
    if !map.fields.is_empty() {
        for _ in 0..rng.below(3) + 1 {
            let fields = if map.item_fields.is_empty() || !rng.one_in(4) { &map.fields } else { &map.item_fields };
            let f = *rng.pick(fields);
            let value = if rng.one_in(3) {
                read_le(&out, f).wrapping_add(rng.below(5) as u64).wrapping_sub(2)
            } else {
                interesting(rng)
            };
            put_le(&mut out, f.at, f.width, value);
        }
    }
    if let Some(start) = map.data_start.filter(|_| rng.one_in(4)) {
        poison_floats(rng, &mut out, start);
    }
    if rng.one_in(3) {
        let (entries, count_at) = if rng.one_in(2) { (&map.kv_entries, 16) } else { (&map.tensor_entries, 8) };
        edit_entry(rng, &mut out, entries, count_at);
    }
    mutate::generic_tail(rng, &mut out, donors, seed.len() * 2);
    out
}

fn read_le(data: &[u8], f: Field) -> u64 {
    let mut v = [0u8; 8];
    v[..f.width].copy_from_slice(&data[f.at..f.at + f.width]);
    u64::from_le_bytes(v)
}

/// Removes or duplicates one entry; adjusts the u64 count at `count_at` half of the time.
fn edit_entry(rng: &mut Rng, out: &mut Vec<u8>, entries: &[(usize, usize)], count_at: usize) {
    if entries.is_empty() || out.len() < count_at + 8 {
        return;
    }
    let (s, e) = *rng.pick(entries);
    let count = read_le(out, Field { at: count_at, width: 8 });
    let remove = rng.one_in(2);
    if remove {
        out.drain(s..e);
    } else {
        let copy = out[s..e].to_vec();
        out.splice(e..e, copy);
    }
    if rng.one_in(2) {
        let fixed = if remove { count.wrapping_sub(1) } else { count.wrapping_add(1) };
        put_le(out, count_at, 8, fixed);
    }
}

/// Writes a NaN, an infinity or a huge value (as f32 or f16 bits) somewhere after `start`.
fn poison_floats(rng: &mut Rng, out: &mut [u8], start: usize) {
    if start >= out.len() {
        return;
    }
    let at = start + rng.below(out.len() - start) / 2 * 2;
    let (bits, width): (u64, usize) = *rng.pick(&[
        (f32::NAN.to_bits().into(), 4),
        (f32::INFINITY.to_bits().into(), 4),
        (f32::MAX.to_bits().into(), 4),
        (0x7e00, 2),
        (0x7c00, 2),
        (0xfc00, 2),
    ]);
    put_le(out, at, width, bits);
}

/// safetensors: the JSON header's tensors edited (dtype, shape, data offsets, entries) or any of
/// its values; the length prefix kept right, or set to an edge; NaNs in the data; byte edits.
pub fn safetensors(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let Some((header, data)) = split_safetensors(seed) else { return generic(rng, seed, donors) };
    let mut header = header;
    for _ in 0..rng.below(3) + 1 {
        if rng.one_in(3) { mutate::json(rng, &mut header) } else { edit_tensor(rng, &mut header) }
    }
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + json.len() + data.len());
    let prefix = if rng.one_in(5) { interesting(rng) } else { json.len() as u64 };
    out.extend_from_slice(&prefix.to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(data);
    if rng.one_in(4) {
        poison_floats(rng, &mut out, 8 + json.len());
    }
    if rng.one_in(3) {
        for _ in 0..rng.below(3) + 1 {
            mutate::bytes(rng, &mut out, donors, seed.len() * 2);
        }
    }
    out
}

fn split_safetensors(seed: &[u8]) -> Option<(Value, &[u8])> {
    let n = usize::try_from(u64::from_le_bytes(seed.get(..8)?.try_into().ok()?)).ok()?;
    let header = serde_json::from_slice(seed.get(8..8usize.checked_add(n)?)?).ok()?;
    Some((header, &seed[8 + n..]))
}

/// One edit of a tensor entry `{dtype, shape, data_offsets}` of a safetensors header.
fn edit_tensor(rng: &mut Rng, header: &mut Value) {
    let Some(map) = header.as_object_mut() else { return };
    let names: Vec<String> = map.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return;
    }
    let name = rng.pick(&names).clone();
    let other = map.get(rng.pick(&names)).and_then(|e| e.get("data_offsets")).cloned();
    match rng.below(6) {
        4 => {
            map.remove(&name);
        }
        5 => {
            if let Some(entry) = map.remove(&name) {
                map.insert(format!("{name}.x"), entry);
            }
        }
        op => {
            let Some(entry) = map.get_mut(&name).and_then(Value::as_object_mut) else { return };
            match op {
                0 => {
                    let dtype = *rng.pick(&["F32", "F16", "BF16", "F64", "I8", "U8", "I64", "BOOL", "F8_E4M3", "X"]);
                    entry.insert("dtype".into(), Value::from(dtype));
                }
                1 => entry.get_mut("shape").into_iter().for_each(|s| edit_shape(rng, s)),
                2 => entry.get_mut("data_offsets").into_iter().for_each(|o| edit_offsets(rng, o)),
                _ => {
                    entry.insert("data_offsets".into(), other.unwrap_or(Value::Null));
                }
            }
        }
    }
}

fn edit_shape(rng: &mut Rng, shape: &mut Value) {
    let Some(dims) = shape.as_array_mut() else { return };
    match rng.below(4) {
        0 if !dims.is_empty() => {
            let at = rng.below(dims.len());
            dims[at] = Value::from(interesting(rng));
        }
        1 => dims.push(Value::from(*rng.pick(&[0u64, 1, 2, 1 << 32]))),
        2 => {
            dims.pop();
        }
        _ => dims.reverse(),
    }
}

fn edit_offsets(rng: &mut Rng, offsets: &mut Value) {
    let Some(pair) = offsets.as_array_mut() else { return };
    match rng.below(4) {
        0 => pair.reverse(),
        1 if !pair.is_empty() => {
            let at = rng.below(pair.len());
            pair[at] = Value::from(interesting(rng));
        }
        2 if !pair.is_empty() => {
            let at = rng.below(pair.len());
            let shifted = pair[at].as_u64().unwrap_or(0).wrapping_add(rng.below(9) as u64).wrapping_sub(4);
            pair[at] = Value::from(shifted);
        }
        _ => {
            pair.pop();
        }
    }
}

/// llama2.c checkpoint: one of the seven i32 header fields at an edge or negated, NaNs among
/// the weights, truncation or extension, byte edits.
pub fn llama2c(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..rng.below(2) + 1 {
        let at = rng.below(7) * 4;
        if out.len() < at + 4 {
            break;
        }
        let old = i32::from_le_bytes(out[at..at + 4].try_into().unwrap_or_default());
        let new = match rng.below(3) {
            0 => old.wrapping_neg(),
            1 => old.wrapping_add(rng.below(5) as i32 - 2),
            _ => interesting(rng) as i32,
        };
        put_le(&mut out, at, 4, u64::from(new as u32));
    }
    if rng.one_in(4) {
        poison_floats(rng, &mut out, 28);
    }
    if rng.one_in(4) {
        let cut = out.len().saturating_sub(rng.below(64));
        out.truncate(cut);
    }
    if rng.one_in(4) {
        mutate::bytes(rng, &mut out, donors, seed.len() * 2);
    }
    out
}

/// llama2.c `tokenizer.bin`: `max_token_length`, then per token `f32 score, i32 len, bytes`.
/// Edits: `max_token_length`, a length field, a score (NaN), piece bytes (invalid UTF-8), an
/// entry removed, truncation, byte edits.
pub fn llama2c_tokenizer(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let entries = tokenizer_entries(seed);
    let mut out = seed.to_vec();
    if entries.is_empty() || rng.one_in(6) {
        put_le(&mut out, 0, 4, interesting(rng));
    } else {
        let (at, len) = *rng.pick(&entries);
        match rng.below(5) {
            0 => put_le(&mut out, at + 4, 4, interesting(rng)),
            1 => put_le(&mut out, at + 4, 4, (len as u64).wrapping_add(rng.below(5) as u64).wrapping_sub(2)),
            2 => put_le(&mut out, at, 4, f32::NAN.to_bits().into()),
            3 if len > 0 => out[at + 8 + rng.below(len)] = *rng.pick(&[0x00, 0xff, 0xc0, 0x80]),
            _ => {
                out.drain(at..at + 8 + len);
            }
        }
    }
    if rng.one_in(4) {
        out.truncate(rng.below(out.len() + 1));
    }
    if rng.one_in(4) {
        mutate::bytes(rng, &mut out, donors, seed.len() * 2);
    }
    out
}

/// `(offset, piece length)` of each token entry of a llama2.c tokenizer file.
fn tokenizer_entries(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut entries = Vec::new();
    let mut at = 4;
    while let Some(len) = bytes.get(at + 4..at + 8).and_then(|b| Some(i32::from_le_bytes(b.try_into().ok()?))) {
        let Ok(len) = usize::try_from(len) else { break };
        if at + 8 + len > bytes.len() {
            break;
        }
        entries.push((at, len));
        at += 8 + len;
    }
    entries
}

/// Byte and text edits only, for inputs whose structure did not parse.
pub fn generic(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    mutate::bytes(rng, &mut out, donors, seed.len() * 2 + 4096);
    mutate::generic_tail(rng, &mut out, donors, seed.len() * 2 + 4096);
    out
}
