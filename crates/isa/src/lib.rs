//! Which instruction set the CPU kernels run with: chosen here, and nowhere else.
//!
//! Every hand-vectorised kernel (qdrift-model's linear layers, attention and RoPE; qdrift-score's
//! exponentials) has a portable build and, on x86-64, an AVX2 and an AVX-512 build, which give
//! the same bits. [`Isa::current`] says which one runs:
//!
//! 1. the ISA a test forced on this thread ([`Isa::forced`], the test hook), else
//! 2. the ISA the `QDRIFT_ISA` environment variable names ([`Isa::from_env`]: `portable`, `avx2`
//!    or `avx512`; it can only narrow the choice, and naming an ISA this CPU cannot run is an
//!    [`IsaError`], which building a model reports), else
//! 3. the widest ISA this CPU runs ([`Isa::detected`]).
//!
//! A kernel reads the ISA once per call, on the calling thread, and hands it to the tasks it
//! spreads over other threads, so a forced ISA covers the whole call.
//!
//! Tests run a kernel at every ISA this CPU runs ([`Isa::runnable_reporting_skips`]) and compare
//! the results bit for bit; the ISAs the CPU cannot run are named on standard error, never
//! passed silently.
//!
//! qdrift-model and qdrift-score both depend on this crate, so that both choose by the same
//! rules. It uses nothing but `std` and `thiserror`.
//!
//! **Architecture invariant:** the choice of ISA is made here and nowhere else, and this crate
//! depends on no qdrift crate.

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::OnceLock;

/// The environment variable that narrows the ISA: `portable`, `avx2` or `avx512`.
pub const ISA_VAR: &str = "QDRIFT_ISA";

/// An instruction set the CPU kernels are built for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler at the target's baseline (SSE2 on x86-64).
    Portable = 0,
    /// 8-wide f32 vectors: AVX2, FMA and F16C.
    Avx2 = 1,
    /// 16-wide f32 vectors: AVX-512F, BW and VL (and AVX2, FMA and F16C, which every CPU with
    /// those has).
    Avx512 = 2,
}

thread_local! {
    /// The ISA [`Isa::forced`] set on this thread, if any.
    static FORCED: Cell<Option<Isa>> = const { Cell::new(None) };
}

impl Isa {
    /// Every ISA, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name `QDRIFT_ISA` takes: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The CPU features this ISA's kernels need, as `is_x86_feature_detected!` names them.
    pub fn features(self) -> &'static [&'static str] {
        match self {
            Isa::Portable => &[],
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Avx512 => &["avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"],
        }
    }

    /// The features of [`Isa::features`] this CPU lacks (all of them off x86-64).
    pub fn missing_features(self) -> Vec<&'static str> {
        self.features().iter().copied().filter(|f| !cpu_has(f)).collect()
    }

    /// Whether this CPU runs this ISA's kernels.
    pub fn runs_here(self) -> bool {
        self.features().iter().all(|f| cpu_has(f))
    }

    /// The widest ISA this CPU runs.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| Isa::ALL.into_iter().rev().find(|isa| isa.runs_here()).unwrap_or(Isa::Portable))
    }

    /// Every ISA this CPU runs, narrowest first (always `portable`).
    pub fn runnable() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.runs_here()).collect()
    }

    /// The ISA `QDRIFT_ISA` names, or [`Isa::detected`] when it is unset or empty; read once per
    /// process.
    ///
    /// # Errors
    /// [`IsaError::Unknown`] for a name that is no ISA, [`IsaError::Unsupported`] for an ISA this
    /// CPU cannot run.
    pub fn from_env() -> Result<Isa, IsaError> {
        static CHOSEN: OnceLock<Result<Isa, IsaError>> = OnceLock::new();
        CHOSEN.get_or_init(|| Isa::from_setting(std::env::var_os(ISA_VAR).as_deref())).clone()
    }

    /// [`Isa::from_env`] for a given value of the variable (`None`: unset).
    fn from_setting(value: Option<&std::ffi::OsStr>) -> Result<Isa, IsaError> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(Isa::detected());
        };
        let name = value.to_str().ok_or_else(|| IsaError::Unknown { value: value.to_string_lossy().into_owned() })?;
        name.parse::<Isa>()?.check()
    }

    /// The ISA the kernels run with on this thread now: forced ([`Isa::forced`]), else named by
    /// `QDRIFT_ISA` ([`Isa::from_env`]), else [`Isa::detected`]. Always one this CPU runs (an
    /// invalid `QDRIFT_ISA` is refused where a model is built; here it falls back to
    /// [`Isa::detected`]).
    pub fn current() -> Isa {
        static DEFAULT: OnceLock<Isa> = OnceLock::new();
        FORCED.with(Cell::get).unwrap_or_else(|| *DEFAULT.get_or_init(|| Isa::from_env().unwrap_or(Isa::detected())))
    }

    /// Runs `f` with the kernels it calls on this thread at this ISA (the test hook): a kernel
    /// reads [`Isa::current`] on its calling thread and carries it into the tasks it spreads, so
    /// the whole call runs at this ISA. Other threads are not affected.
    ///
    /// # Errors
    /// [`IsaError::Unsupported`] if this CPU cannot run this ISA (`f` is not run).
    pub fn forced<T>(self, f: impl FnOnce() -> T) -> Result<T, IsaError> {
        /// Restores the thread's previous choice, also when `f` panics.
        struct Restore(Option<Isa>);
        impl Drop for Restore {
            fn drop(&mut self) {
                FORCED.with(|c| c.set(self.0));
            }
        }
        self.check()?;
        let _restore = Restore(FORCED.with(|c| c.replace(Some(self))));
        Ok(f())
    }

    /// This ISA if this CPU runs it.
    ///
    /// # Errors
    /// [`IsaError::Unsupported`] naming the features the CPU lacks.
    pub fn check(self) -> Result<Isa, IsaError> {
        if self.runs_here() {
            return Ok(self);
        }
        let runnable = Isa::runnable().into_iter().map(Isa::name).collect();
        Err(IsaError::Unsupported { isa: self, missing: self.missing_features(), runnable })
    }

    /// [`Isa::runnable`], for a test that runs a kernel at each: every other ISA is reported as
    /// skipped on the process's standard error (written directly, not through the test
    /// harness's captured output, so that every test run shows it), with the features this CPU
    /// lacks: `{test}: skipped the avx512 kernels, this CPU lacks avx512f, avx512bw, avx512vl`.
    pub fn runnable_reporting_skips(test: &str) -> Vec<Isa> {
        use std::io::Write;
        for isa in Isa::ALL.into_iter().filter(|isa| !isa.runs_here()) {
            let line =
                format!("{test}: skipped the {} kernels, this CPU lacks {}\n", isa, isa.missing_features().join(", "));
            // A note for the reader of the log; a failed write changes no result.
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        Isa::runnable()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = IsaError;

    /// An ISA by [`Isa::name`] (ASCII case ignored, surrounding spaces trimmed).
    fn from_str(s: &str) -> Result<Isa, IsaError> {
        let name = s.trim();
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| IsaError::Unknown { value: s.to_string() })
    }
}

/// An ISA that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// `QDRIFT_ISA` (or a parsed name) is no ISA.
    #[error("{ISA_VAR}={value:?} names no instruction set of the CPU kernels; use portable, avx2 or avx512")]
    Unknown {
        /// The value given.
        value: String,
    },
    /// The CPU cannot run the ISA asked for.
    #[error(
        "this CPU cannot run the {isa} kernels: it lacks {}; it runs {} (set {ISA_VAR} to one of those, or unset it)",
        .missing.join(", "),
        .runnable.join(", ")
    )]
    Unsupported {
        /// The ISA asked for.
        isa: Isa,
        /// The features the CPU lacks for it.
        missing: Vec<&'static str>,
        /// The ISAs it runs, by name.
        runnable: Vec<&'static str>,
    },
}

/// Whether this CPU has `feature` (one of those [`Isa::features`] names).
fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "f16c" => std::is_x86_feature_detected!("f16c"),
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
            assert_eq!(isa.name().to_uppercase().parse::<Isa>(), Ok(isa));
        }
        let e = "sse4".parse::<Isa>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "QDRIFT_ISA=\"sse4\" names no instruction set of the CPU kernels; use portable, avx2 or avx512"
        );
    }

    #[test]
    fn the_setting_narrows_and_refuses_what_the_cpu_cannot_run() {
        use std::ffi::OsStr;
        assert_eq!(Isa::from_setting(None), Ok(Isa::detected()));
        assert_eq!(Isa::from_setting(Some(OsStr::new(""))), Ok(Isa::detected()));
        assert_eq!(Isa::from_setting(Some(OsStr::new("portable"))), Ok(Isa::Portable));
        for isa in Isa::ALL {
            let got = Isa::from_setting(Some(OsStr::new(isa.name())));
            if isa.runs_here() {
                assert_eq!(got, Ok(isa));
            } else {
                let e = got.unwrap_err().to_string();
                assert!(e.starts_with(&format!("this CPU cannot run the {isa} kernels: it lacks ")), "{e}");
                assert!(e.contains("it runs portable"), "{e}");
            }
        }
        assert!(matches!(Isa::from_setting(Some(OsStr::new("avx1024"))), Err(IsaError::Unknown { .. })));
    }

    #[test]
    fn forcing_an_isa_holds_for_the_call_on_this_thread_only() {
        assert!(Isa::detected().runs_here() && Isa::Portable.runs_here());
        assert_eq!(Isa::runnable().first(), Some(&Isa::Portable));
        assert_eq!(Isa::runnable().last(), Some(&Isa::detected()));
        let before = Isa::current();
        for isa in Isa::runnable_reporting_skips("forcing_an_isa_holds_for_the_call_on_this_thread_only") {
            let (here, elsewhere) = isa
                .forced(|| {
                    let nested = Isa::Portable.forced(Isa::current).expect("portable runs everywhere");
                    assert_eq!(nested, Isa::Portable);
                    (Isa::current(), std::thread::spawn(Isa::current).join().expect("joins"))
                })
                .expect("runnable");
            assert_eq!((here, elsewhere), (isa, before));
            assert_eq!(Isa::current(), before, "restored");
        }
        for isa in Isa::ALL.into_iter().filter(|isa| !isa.runs_here()) {
            assert!(matches!(isa.forced(|| ()), Err(IsaError::Unsupported { .. })));
        }
    }
}
