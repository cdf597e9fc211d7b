//! `qdrift bandwidth` (hidden): the device's memory bandwidth measured with a copy kernel
//! ([`qdrift_generate::copy_bandwidth`]), printed as one JSON line on stdout. `cargo xtask bench
//! gpu` divides a model's weight bytes by it for the bandwidth bound of a decode step.

use std::error::Error;

use clap::Args;
use qdrift_generate::{BackendChoice, copy_bandwidth, select_device};

/// Arguments of `qdrift bandwidth`.
#[derive(Args)]
pub struct BandwidthArgs {
    /// auto, wgpu (even on a software adapter) or cpu.
    #[arg(long, default_value = "wgpu")]
    backend: BackendChoice,
    /// Size of the copied tensor in MiB (read and written once per copy).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    mib: u64,
    /// Timed repetitions after two untimed ones; the fastest counts.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    reps: u64,
}

/// Runs `qdrift bandwidth`.
pub fn run(args: &BandwidthArgs) -> Result<(), Box<dyn Error>> {
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
