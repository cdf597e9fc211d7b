//! The readers of the two-file containers qdrift writes itself: a shard's part (`part.json` +
//! `traces.bin`, then `qdrift merge`) and a saved reference (`manifest.json` + `reference.bin`,
//! read as `--reference` reads it). Each input is one bundle of both files ([`bundle`]), so that
//! a mutation can edit the JSON, the data, or both, and then (most of the time) recompute the
//! seal that ends the data file ([`qdrift_eval::seal`]): without that, every edit would stop at
//! the checksum and the range checks behind it would never run.

use std::path::{Path, PathBuf};

use qdrift_eval::{
    EvalConfig, Evaluated, PART_FORMAT, Part, STORE_FORMAT, Shard, StoreKey, StoreModel, VariantSpec, merge, seal,
    verify_store,
};
use qdrift_generate::BackendChoice;
use qdrift_quantize::Recipe;

use super::mutate::{self, put_le};
use super::{Outcome, Rng, Target};

/// Bytes of the seal at the end of a data file.
const SEAL: usize = 32;

/// Both files of a container as one input: the JSON's length (u64 little-endian), the JSON, then
/// the data file.
fn bundle(json: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json);
    out.extend_from_slice(data);
    out
}

/// [`bundle`] split back (a length past the end takes everything as JSON).
fn unbundle(input: &[u8]) -> (&[u8], &[u8]) {
    let Some(len) = input.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())) else {
        return (input, &[]);
    };
    let rest = &input[8..];
    let at = usize::try_from(len).unwrap_or(usize::MAX).min(rest.len());
    rest.split_at(at)
}

/// Writes a bundle's two files as `dir/json_name` and `dir/data_name`.
fn unpack(input: &[u8], dir: &Path, names: (&str, &str)) -> Result<(), String> {
    let (json, data) = unbundle(input);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, bytes) in [(names.0, json), (names.1, data)] {
        std::fs::write(dir.join(name), bytes).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// Overwrites one aligned value of `data` (before its seal) with a value no run writes: a NaN,
/// an infinity, a negative or too large float, a token id past any vocabulary, a byte past 1.
fn poison(rng: &mut Rng, data: &mut [u8]) {
    let end = data.len().saturating_sub(SEAL);
    if end < 4 {
        return;
    }
    let at = rng.below(end / 4) * 4;
    let (bits, width): (u64, usize) = *rng.pick(&[
        (f32::NAN.to_bits().into(), 4),
        (f32::INFINITY.to_bits().into(), 4),
        (f32::NEG_INFINITY.to_bits().into(), 4),
        ((-0.5f32).to_bits().into(), 4),
        (0.5f32.to_bits().into(), 4),
        (1e30f32.to_bits().into(), 4),
        (u32::MAX.into(), 4),
        (320, 4),
        (2, 1),
        (0x7c00, 2),
        (f64::NAN.to_bits(), 8),
        ((-1.0f64).to_bits(), 8),
    ]);
    put_le(data, at, width, bits);
}

/// A bundle mutated: its JSON (value, text and byte edits), its data (poisoned values, byte
/// edits) or both; then, seven times in eight, the data file's seal recomputed over the new
/// files; now and then byte edits of the whole bundle (its framing included).
fn mutate_sealed(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>], format: &str) -> Vec<u8> {
    let (json, data) = unbundle(seed);
    let (mut json, mut data) = (json.to_vec(), data.to_vec());
    let what = rng.below(4);
    if what != 1 {
        let donor_jsons: Vec<Vec<u8>> = donors.iter().map(|d| unbundle(d).0.to_vec()).collect();
        json = mutate::json_document(rng, &json, &donor_jsons);
    }
    if what >= 1 {
        for _ in 0..rng.below(3) + 1 {
            if rng.one_in(4) {
                let cap = data.len() + 4096;
                mutate::bytes(rng, &mut data, &[], cap);
            } else {
                poison(rng, &mut data);
            }
        }
    }
    if !rng.one_in(8) && data.len() >= SEAL {
        let body = data.len() - SEAL;
        let digest = seal(format, &json, &data[..body]);
        data[body..].copy_from_slice(&digest);
    }
    let mut out = bundle(&json, &data);
    if rng.one_in(16) {
        let cap = out.len() + 4096;
        mutate::bytes(rng, &mut out, donors, cap);
    }
    out
}

/// A tiny evaluation (the `tiny` synthetic model on the CPU, four prompts of `work/prompts.jsonl`,
/// horizons 3 and 5, batches of one, teacher forcing two positions at a time) with KL `top_k`.
fn tiny_eval(work: &Path, top_k: Option<usize>) -> Result<EvalConfig, String> {
    let set = work.join("prompts.jsonl");
    let lines: String =
        (1..=4).map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"Once upon a time {i}\"}}\n")).collect();
    std::fs::write(&set, lines).map_err(|e| format!("{}: {e}", set.display()))?;
    let mut cfg = EvalConfig::new(PathBuf::from("synthetic:tiny:7"));
    cfg.eval_set = Some(set);
    cfg.variants = vec![VariantSpec::Scheme("int8".parse::<Recipe>().map_err(|e| e.to_string())?)];
    cfg.horizons = vec![3, 5];
    cfg.backend = BackendChoice::Cpu;
    cfg.batch_size = Some(1);
    cfg.resamples = 10;
    cfg.chunk = 2;
    cfg.reference_top_k = top_k;
    Ok(cfg)
}

/// The two KL modes of the seeds: exact, and top-4.
const MODES: [(Option<usize>, &str); 2] = [(None, "exact"), (Some(4), "top4")];

/// Shard `index` of 2 of [`tiny_eval`], written to `dir`.
fn write_part(work: &Path, top_k: Option<usize>, index: usize, dir: &Path) -> Result<(), String> {
    let mut cfg = tiny_eval(work, top_k)?;
    cfg.shard = Some(Shard { index, count: 2 });
    let Evaluated::Part(part) = qdrift_eval::evaluate_any(&cfg, &mut |_| {}).map_err(|e| e.to_string())? else {
        return Err("a shard gives a part".into());
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    part.write(dir).map_err(|e| e.to_string())
}

fn read_bundle(dir: &Path, names: (&str, &str)) -> Result<Vec<u8>, String> {
    let read = |name: &str| std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}"));
    Ok(bundle(&read(names.0)?, &read(names.1)?))
}

/// A shard's part, merged with the other shard's (written once, unmutated).
pub struct PartTarget;

const PART_FILES: (&str, &str) = ("part.json", "traces.bin");

impl Target for PartTarget {
    fn name(&self) -> &'static str {
        "part"
    }
    fn input_name(&self) -> &'static str {
        "part.bundle"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        let mut seeds = Vec::new();
        for (top_k, mode) in MODES {
            let seed_dir = work.join(format!("seed-{mode}"));
            write_part(work, top_k, 0, &seed_dir)?;
            seeds.push(read_bundle(&seed_dir, PART_FILES)?);
            write_part(work, top_k, 1, &work.join(format!("other-{mode}")))?;
        }
        Ok(seeds)
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate_sealed(rng, seed, donors, PART_FORMAT)
    }
    fn run(&self, input: &Path) -> Outcome {
        let work = input.parent().unwrap_or(input);
        let dir = work.join("part");
        let Ok(bytes) = std::fs::read(input) else { return Outcome::Refused("unreadable input".into()) };
        if let Err(e) = unpack(&bytes, &dir, PART_FILES) {
            return Outcome::Refused(e);
        }
        if let Err(e) = Part::read(&dir) {
            return Outcome::Refused(e.to_string());
        }
        // Accepted when it merges with the other shard of either mode, made to agree with it: the
        // other part's run context and variants replaced by the mutated part's (and resealed),
        // so that an edit of the context reaches the report's assembly rather than stopping at
        // "comes from another run".
        let mut last = String::new();
        for (_, mode) in MODES {
            let other = work.join(format!("other-{mode}"));
            let agreeing = work.join("agreeing");
            if let Err(e) = agree(&dir, &other, &agreeing) {
                return Outcome::Refused(e);
            }
            let parts = [Part::read(&dir), Part::read(&agreeing)];
            let [Ok(a), Ok(b)] = parts else { return Outcome::Refused("the parts no longer read".into()) };
            match merge(vec![a, b]) {
                Ok(report) => {
                    let _ = qdrift_report::render_markdown(&report);
                    return Outcome::Accepted;
                }
                Err(e) => last = e.to_string(),
            }
        }
        Outcome::Refused(last)
    }
}

/// Writes to `to` the part at `other` with the run context and variants of the part at `part`,
/// resealed.
fn agree(part: &Path, other: &Path, to: &Path) -> Result<(), String> {
    let read = |p: PathBuf| std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()));
    let json = |b: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string());
    let mutated = json(read(part.join(PART_FILES.0))?)?;
    let mut header = json(read(other.join(PART_FILES.0))?)?;
    for field in ["context", "variants"] {
        header[field] = mutated[field].clone();
    }
    let text = serde_json::to_vec_pretty(&header).map_err(|e| e.to_string())?;
    let mut data = read(other.join(PART_FILES.1))?;
    let body = data.len().saturating_sub(SEAL);
    let digest = seal(PART_FORMAT, &text, &data[..body]);
    data.truncate(body);
    data.extend_from_slice(&digest);
    unpack(&bundle(&text, &data), to, PART_FILES)
}

/// A saved reference, read as a run with the seed's key on the `tiny` model would read it.
pub struct StoreTarget;

const STORE_FILES: (&str, &str) = ("manifest.json", "reference.bin");

/// The `tiny` synthetic preset's vocabulary and width.
const TINY: StoreModel = StoreModel { vocab: 320, dim: 32 };

/// The keys of the seed stores, as the runs that saved them had them.
fn seed_keys(work: &Path) -> Vec<StoreKey> {
    MODES
        .iter()
        .filter_map(|(_, mode)| std::fs::read(work.join(format!("key-{mode}.json"))).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}

impl Target for StoreTarget {
    fn name(&self) -> &'static str {
        "store"
    }
    fn input_name(&self) -> &'static str {
        "store.bundle"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        let mut seeds = Vec::new();
        for (top_k, mode) in MODES {
            let mut cfg = tiny_eval(work, top_k)?;
            let dir = work.join(format!("seed-{mode}"));
            cfg.save_reference = Some(dir.clone());
            qdrift_eval::evaluate(&cfg, &mut |_| {}).map_err(|e| e.to_string())?;
            let manifest: serde_json::Value = serde_json::from_slice(
                &std::fs::read(dir.join(STORE_FILES.0)).map_err(|e| format!("{}: {e}", STORE_FILES.0))?,
            )
            .map_err(|e| e.to_string())?;
            let key = work.join(format!("key-{mode}.json"));
            std::fs::write(&key, manifest["key"].to_string()).map_err(|e| format!("{}: {e}", key.display()))?;
            seeds.push(read_bundle(&dir, STORE_FILES)?);
        }
        Ok(seeds)
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate_sealed(rng, seed, donors, STORE_FORMAT)
    }
    fn run(&self, input: &Path) -> Outcome {
        let work = input.parent().unwrap_or(input);
        let dir = work.join("store");
        let Ok(bytes) = std::fs::read(input) else { return Outcome::Refused("unreadable input".into()) };
        if let Err(e) = unpack(&bytes, &dir, STORE_FILES) {
            return Outcome::Refused(e);
        }
        let mut last = String::from("no seed keys");
        for key in seed_keys(work) {
            match verify_store(&dir, &key, TINY) {
                Ok(()) => return Outcome::Accepted,
                Err(e) => last = e.to_string(),
            }
        }
        Outcome::Refused(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::Workspace;

    /// Most mutations get past the seal (the mutator recomputes it) to the checks behind it, and
    /// some are still accepted: otherwise the fuzzer would only ever test the checksum.
    #[test]
    fn mutations_get_past_the_seal_to_the_range_checks() {
        let tmp = tempfile::tempdir().expect("temp dir");
        for target in [&PartTarget as &dyn Target, &StoreTarget] {
            let ws = Workspace::new(target, &tmp.path().join(target.name())).expect("prepares");
            let mut rng = Rng::new(5);
            let (mut sealed, mut accepted, mut past) = (0, 0, 0);
            for _ in 0..300 {
                let seed = rng.pick(&ws.seeds);
                let input = target.mutate(&mut rng, seed, &ws.seeds);
                match ws.exec(target, &input).expect("no panic") {
                    Outcome::Accepted => accepted += 1,
                    Outcome::Refused(e) if e.contains("checksum") => sealed += 1,
                    Outcome::Refused(_) => past += 1,
                }
            }
            println!("{}: {accepted} accepted, {past} refused past the seal, {sealed} by the seal", target.name());
            assert!(past > 150 && accepted > 0 && sealed > 0, "{}", target.name());
        }
    }

    #[test]
    fn a_bundle_splits_back_into_its_files_and_a_bad_length_takes_all_as_json() {
        let b = bundle(b"{}", b"data");
        assert_eq!(unbundle(&b), (&b"{}"[..], &b"data"[..]));
        let mut bad = b.clone();
        bad[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(unbundle(&bad), (&b"{}data"[..], &b""[..]));
        assert_eq!(unbundle(b"abc"), (&b"abc"[..], &b""[..]));
    }
}
