//! Format-independent mutations: bytes, text lines and tokens, JSON values.

use serde_json::Value;

use super::Rng;

/// Integers at the edges where size arithmetic overflows or allocations explode.
pub const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 48,
    1 << 62,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// Numbers as text: what JSON and TOML parsers and range checks must refuse or carry.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "0.5",
    "1e308",
    "1e999",
    "-1e999",
    "5e-324",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "4294967296",
    "2147483648",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1e-400",
    "0x10",
];

/// Strings that trip parsers, name lookups and renderers.
const STRINGS: &[&str] = &[
    "",
    "*",
    " ",
    "\\u0000",
    "\\ud800",
    "é",
    "🦀",
    "<script>",
    "../../etc/passwd",
    "kld@0",
    "kld@18446744073709551616",
    "top1_agreement@10",
    "noise_floor",
    "F16",
    "BF16",
    "llama",
    "qwen2",
];

/// One interesting integer, or a small step from one.
pub fn interesting(rng: &mut Rng) -> u64 {
    let base = *rng.pick(INTERESTING);
    match rng.below(4) {
        0 => base.wrapping_add(rng.below(16) as u64 + 1),
        1 => base.wrapping_sub(rng.below(16) as u64 + 1),
        _ => base,
    }
}

/// A random range `start..end` of `len` bytes, at most `max` long.
fn range(rng: &mut Rng, len: usize, max: usize) -> (usize, usize) {
    let start = rng.below(len + 1);
    let end = start + rng.below((len - start).min(max) + 1);
    (start, end)
}

/// Overwrites `width` bytes at `at` (clipped to the buffer) with `value` little-endian.
pub fn put_le(data: &mut [u8], at: usize, width: usize, value: u64) {
    for (i, b) in value.to_le_bytes().iter().take(width).enumerate() {
        if let Some(slot) = data.get_mut(at + i) {
            *slot = *b;
        }
    }
}

/// One byte-level edit: bit flip, interesting byte/u32/u64, truncation, deletion, duplication,
/// random insertion, or a splice from a donor. Growth is capped at `cap` bytes.
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>], cap: usize) {
    let len = data.len();
    match rng.below(9) {
        0 if len > 0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            data[at] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'"', b'\n', b'{', b'[']);
        }
        2 if len > 0 => put_le(data, rng.below(len), 4, interesting(rng)),
        3 if len > 0 => put_le(data, rng.below(len), 8, interesting(rng)),
        4 => data.truncate(rng.below(len + 1)),
        5 => {
            let (start, end) = range(rng, len, 4096);
            data.drain(start..end);
        }
        6 if len < cap => {
            let (start, end) = range(rng, len, 4096);
            let copy = data[start..end].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, copy);
        }
        7 if len < cap => {
            let at = rng.below(len + 1);
            let random: Vec<u8> = (0..rng.below(32) + 1).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, random);
        }
        _ => splice(rng, data, donors, cap),
    }
}

/// Copies a range of a donor over (or into) `data`.
fn splice(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>], cap: usize) {
    if donors.is_empty() {
        return;
    }
    let donor = rng.pick(donors);
    let (start, end) = range(rng, donor.len(), 4096);
    let at = rng.below(data.len() + 1);
    if rng.one_in(2) || data.len() + (end - start) > cap {
        let end_at = (at + end - start).min(data.len());
        data.splice(at..end_at, donor[start..end].iter().copied());
    } else {
        data.splice(at..at, donor[start..end].iter().copied());
    }
}

/// Spans of number-looking tokens (`-12.5e3`) in `text`.
fn number_spans(text: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let starts = text[i].is_ascii_digit() || (text[i] == b'-' && text.get(i + 1).is_some_and(u8::is_ascii_digit));
        if starts && (i == 0 || !text[i - 1].is_ascii_alphanumeric()) {
            let start = i;
            i += 1;
            while i < text.len() && (text[i].is_ascii_digit() || matches!(text[i], b'.' | b'e' | b'E' | b'+' | b'-')) {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    spans
}

/// Spans of the contents of `"..."` strings (without escapes) in `text`.
fn string_spans(text: &[u8]) -> Vec<(usize, usize)> {
    let quotes: Vec<usize> = text.iter().enumerate().filter(|(_, b)| **b == b'"').map(|(i, _)| i).collect();
    quotes.chunks_exact(2).map(|q| (q[0] + 1, q[1])).collect()
}

/// Line spans (each with its newline) of `text`.
fn line_spans(text: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (i, b) in text.iter().enumerate() {
        if *b == b'\n' {
            spans.push((start, i + 1));
            start = i + 1;
        }
    }
    if start < text.len() {
        spans.push((start, text.len()));
    }
    spans
}

/// One text-level edit: a number or string token replaced by an edge value, a line dropped,
/// duplicated or swapped with another, or a deep nesting inserted.
pub fn text(rng: &mut Rng, data: &mut Vec<u8>) {
    match rng.below(7) {
        0 | 1 => replace_span(rng, data, &number_spans(data), NUMBERS),
        2 => replace_span(rng, data, &string_spans(data), STRINGS),
        3 => {
            let lines = line_spans(data);
            if !lines.is_empty() {
                let (s, e) = *rng.pick(&lines);
                data.drain(s..e);
            }
        }
        4 => {
            let lines = line_spans(data);
            if !lines.is_empty() {
                let (s, e) = *rng.pick(&lines);
                let copy = data[s..e].to_vec();
                let at = rng.pick(&lines).0;
                data.splice(at..at, copy);
            }
        }
        5 => swap_lines(rng, data),
        _ => {
            let at = rng.below(data.len() + 1);
            let depth = *rng.pick(&[64usize, 200, 5000]);
            let open = if rng.one_in(2) { b'[' } else { b'{' };
            data.splice(at..at, std::iter::repeat_n(open, depth));
        }
    }
}

fn replace_span(rng: &mut Rng, data: &mut Vec<u8>, spans: &[(usize, usize)], with: &[&str]) {
    if spans.is_empty() {
        return;
    }
    let (s, e) = *rng.pick(spans);
    data.splice(s..e, rng.pick(with).bytes());
}

fn swap_lines(rng: &mut Rng, data: &mut Vec<u8>) {
    let lines = line_spans(data);
    if lines.len() < 2 {
        return;
    }
    let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
    let (first, second) = (lines[a.min(b)], lines[a.max(b)]);
    if first == second {
        return;
    }
    let mut out = data[..first.0].to_vec();
    out.extend_from_slice(&data[second.0..second.1]);
    out.extend_from_slice(&data[first.1..second.0]);
    out.extend_from_slice(&data[first.0..first.1]);
    out.extend_from_slice(&data[second.1..]);
    *data = out;
}

/// The `n`-th node of `v` in pre-order (`n` counts down), for a uniformly chosen edit site.
fn nth_node<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(items) => items.iter_mut().find_map(|c| nth_node(c, n)),
        Value::Object(map) => map.values_mut().find_map(|c| nth_node(c, n)),
        _ => None,
    }
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// A number at the edges JSON can carry (NaN and infinities are left to [`text`]).
fn json_number(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => Value::from(interesting(rng)),
        1 => Value::from((interesting(rng) as i64).wrapping_neg()),
        2 => Value::from(*rng.pick(&[0.0, -0.0, 0.5, 1e308, -1e308, 5e-324, 1.0000000000000002])),
        _ => Value::from(rng.below(2000) as i64 - 1000),
    }
}

/// One edit of a random node of `v`: a number or string at an edge, another type, a key dropped,
/// duplicated or renamed, an array element dropped or repeated.
pub fn json(rng: &mut Rng, v: &mut Value) {
    let mut n = rng.below(count_nodes(v));
    let Some(node) = nth_node(v, &mut n) else { return };
    match node {
        Value::Object(map) if !map.is_empty() && rng.one_in(2) => {
            let key = map.keys().nth(rng.below(map.len())).cloned().unwrap_or_default();
            match rng.below(3) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let value = map[&key].clone();
                    map.insert(format!("{key}_"), value);
                }
                _ => {
                    if let Some(value) = map.remove(&key) {
                        map.insert(rng.pick(STRINGS).to_string(), value);
                    }
                }
            }
        }
        Value::Array(items) if !items.is_empty() && rng.one_in(2) => {
            let at = rng.below(items.len());
            match rng.below(3) {
                0 => {
                    items.remove(at);
                }
                1 => items.truncate(at),
                _ => {
                    let copy = items[at].clone();
                    let times = *rng.pick(&[1usize, 2, 100]);
                    items.extend(std::iter::repeat_n(copy, times));
                }
            }
        }
        Value::Number(_) if rng.one_in(2) => *node = json_number(rng),
        Value::String(s) if rng.one_in(2) => *s = rng.pick(STRINGS).replace("\\u0000", "\0"),
        _ => *node = other_type(rng, node),
    }
}

fn other_type(rng: &mut Rng, node: &Value) -> Value {
    match rng.below(7) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => json_number(rng),
        3 => Value::from(rng.pick(STRINGS).to_string()),
        4 => Value::Array(vec![]),
        5 => Value::Object(serde_json::Map::new()),
        _ => Value::Array(vec![node.clone(), node.clone()]),
    }
}

/// A JSON document mutated: 1–4 value edits (when it parses), then text edits (NaN, duplicate
/// keys, lines) and byte edits now and then.
pub fn json_document(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let mut out = match serde_json::from_slice::<Value>(seed) {
        Ok(mut v) if !rng.one_in(5) => {
            for _ in 0..rng.below(4) + 1 {
                json(rng, &mut v);
            }
            let text = if rng.one_in(2) { serde_json::to_vec(&v) } else { serde_json::to_vec_pretty(&v) };
            text.unwrap_or_else(|_| seed.to_vec())
        }
        _ => seed.to_vec(),
    };
    generic_tail(rng, &mut out, donors, seed.len() * 4 + 4096);
    out
}

/// Text edits and byte edits, each now and then: the common tail of every mutation.
pub fn generic_tail(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>], cap: usize) {
    if rng.one_in(3) {
        for _ in 0..rng.below(3) + 1 {
            text(rng, data);
        }
    }
    if rng.one_in(3) {
        for _ in 0..rng.below(4) + 1 {
            bytes(rng, data, donors, cap);
        }
    }
}
