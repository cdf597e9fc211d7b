//! A structure-aware fuzzer for qdrift's readers, on stable Rust.
//!
//! Each [`Target`] writes valid seed inputs (built in code from a tiny synthetic model, the
//! stories260K files, a sample report, a tiny evaluation's shard parts and saved references),
//! mutates one seed per execution with format-aware edits (GGUF header fields and entries,
//! safetensors JSON headers and length prefix, llama2.c header ints, JSON/TOML values and lines,
//! a part's or store's JSON and data with their seal recomputed) followed by byte-level edits,
//! and runs its reader in-process.
//! A panic is a crash; [`runner`] adds a hang watchdog and the `qdrift-fuzz` binary a memory guard,
//! and a supervisor process saves the input of a worker that died (abort, out of memory, hang).
//!
//! Why our own mutator rather than `cargo fuzz`/`bolero`/`proptest`: coverage-guided engines need
//! nightly sanitizer flags, and `proptest`'s strategies generate typed values, not mutations of
//! real files; what finds reader bugs here is knowing where a file's counts, lengths, offsets and
//! types are, which a small mutator per format says directly. It is seeded (SplitMix64) so that
//! a run is reproducible from `--seed`.

pub mod crashes;
mod formats;
pub mod mutate;
pub mod panics;
pub mod runner;
mod sealed;
mod targets;

use std::path::{Path, PathBuf};

pub use targets::targets;

/// SplitMix64: tiny, fast and good enough to choose mutations; reproducible from its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next_u64() % n as u64) as usize }
    }

    /// True once in `n` calls on average.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What a reader did with an input: both are fine for the fuzzer, only a panic (or dying) is not.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The reader accepted the input.
    Accepted,
    /// The reader returned this error.
    Refused(String),
}

/// One reader under test.
pub trait Target: Send + Sync {
    /// Short name: `--target NAME` and the folder of its crashes.
    fn name(&self) -> &'static str;

    /// Where the input is written inside the work folder (the reader opens it from there).
    fn input_name(&self) -> &'static str;

    /// Writes the fixed files beside the input into `work` and returns the seed inputs.
    ///
    /// # Errors
    /// A seed cannot be built or written.
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String>;

    /// A mutation of `seed`; `donors` (all seeds) give splices.
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8>;

    /// Runs the reader on the input at `input` (and whatever it does with an accepted input).
    fn run(&self, input: &Path) -> Outcome;
}

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static dyn Target> {
    targets().iter().copied().find(|t| t.name() == name)
}

/// A prepared work folder for one target: its seeds and the path its input is written to.
pub struct Workspace {
    /// Seed inputs from [`Target::prepare`].
    pub seeds: Vec<Vec<u8>>,
    /// Where each input goes before the reader runs.
    pub input: PathBuf,
}

impl Workspace {
    /// Prepares `target` in `work` (created if missing).
    ///
    /// # Errors
    /// The folder or a seed cannot be written.
    pub fn new(target: &dyn Target, work: &Path) -> Result<Workspace, String> {
        std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
        let seeds = target.prepare(work)?;
        let input = work.join(target.input_name());
        Ok(Workspace { seeds, input })
    }

    /// Writes `input` where the reader expects it and runs the reader, catching a panic.
    ///
    /// # Errors
    /// The panic's message, or the I/O error writing the input.
    pub fn exec(&self, target: &dyn Target, input: &[u8]) -> Result<Outcome, String> {
        std::fs::write(&self.input, input).map_err(|e| format!("{}: {e}", self.input.display()))?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.run(&self.input)))
            .map_err(|payload| panics::panic_message(payload.as_ref()))
    }
}
