//! `qdrift bandwidth` (hidden): the device's memory bandwidth measured with a copy kernel
//! ([`qdrift_generate::copy_bandwidth`]), printed as one JSON line on stdout. `cargo xtask bench
//! gpu` divides a model's weight bytes by it for the bandwidth bound of a decode step.

use std::error::Error;

use clap::Args;
use qdrift_generate::{BackendChoice, copy_bandwidth, select_device};

/// Arguments of `qdrift bandwidth`.
#[derive(Args)]
pub struct BandwidthArgs {
    /// Where to measure.
    #[arg(long, default_value = "wgpu", value_parser = crate::args::backend_parser())]
    backend: BackendChoice,
    /// Size of the copied tensor in MiB (read and written once per copy).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    mib: u64,
    /// Timed repetitions after two untimed ones; the fastest counts.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    reps: u64,
}

/// Buffers of `--mib` the copy holds at once: the source and the 8 copies of one repetition
/// (`COPIES_PER_REP` in `qdrift-generate`'s timing.rs).
const LIVE_BUFFERS: u64 = 9;

/// Runs `qdrift bandwidth`.
pub fn run(args: &BandwidthArgs) -> Result<(), Box<dyn Error>> {
    check_memory(args.mib, available_memory())?;
    let device = select_device(args.backend)?;
    let reps = usize::try_from(args.reps)?;
    let measured = copy_bandwidth(&device, args.mib << 20, reps)?;
    let line = serde_json::json!({
        "bandwidth": "qdrift bandwidth",
        "backend": device.backend,
        "adapter": device.adapter,
        "bytes": measured.bytes,
        "copies": measured.copies,
        "best_s": measured.best_s,
        "bytes_per_s": measured.bytes_per_s(),
    });
    println!("{line}");
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo` in bytes; `None` where the kernel does not say (not Linux).
fn available_memory() -> Option<u64> {
    // A kernel file, not one a user hands qdrift: it reports a length of 0, so it is read directly.
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&info)
}

/// `MemAvailable: N kB` of a `/proc/meminfo` text, in bytes.
fn meminfo_available(info: &str) -> Option<u64> {
    let kib: u64 =
        info.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a `--mib` whose [`LIVE_BUFFERS`] buffers would take more than half of the `available`
/// memory (bytes; no check when unknown), before anything is allocated.
fn check_memory(mib: u64, available: Option<u64>) -> Result<(), String> {
    let Some(available) = available else { return Ok(()) };
    let needed = mib.checked_mul(LIVE_BUFFERS).and_then(|m| m.checked_mul(1 << 20));
    if needed.is_some_and(|n| n <= available / 2) {
        return Ok(());
    }
    Err(format!(
        "--mib {mib}: the copy holds {LIVE_BUFFERS} buffers of {mib} MiB at once, more than half of this machine's \
         available memory ({} MiB; /proc/meminfo MemAvailable); use --mib {} or less",
        available >> 20,
        (available / 2 / LIVE_BUFFERS) >> 20,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_half_the_available_memory_are_refused() {
        let gib = 1u64 << 30;
        assert!(check_memory(1024, Some(32 * gib)).is_ok());
        assert!(check_memory(1024, None).is_ok());
        let e = check_memory(1024, Some(16 * gib)).unwrap_err();
        assert!(e.starts_with("--mib 1024: ") && e.contains("use --mib 910 or less"), "{e}");
        assert!(check_memory(u64::MAX, Some(u64::MAX)).is_err());
        assert_eq!(meminfo_available("MemTotal: 8 kB\nMemAvailable:    2048 kB\n"), Some(2 << 20));
        assert_eq!(meminfo_available("MemTotal: 8 kB\n"), None);
    }
}
