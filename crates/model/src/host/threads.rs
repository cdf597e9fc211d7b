//! How the CPU kernels use threads: a linear layer or an attention call big enough fork-joins
//! over rayon's threads ([`spreads`]), unless its thread runs batches side by side with others
//! ([`single_threaded`]), which already keep every core busy. Either way every output is computed
//! by the same operations, so the results do not depend on the threads.

use std::cell::Cell;

/// Multiply-adds below which a call stays on its thread (a fork-join costs microseconds).
const PARALLEL_MIN_MACS: usize = 1 << 16;

thread_local! {
    /// Whether this thread may spread a layer over the cores (false on threads that run batches
    /// side by side, which already keep every core busy).
    static SPREAD: Cell<bool> = const { Cell::new(true) };
}

/// Whether a call of `macs` multiply-adds fork-joins over rayon's threads: this thread may
/// spread ([`single_threaded`]), there is more than one thread, and the work is worth a
/// fork-join. Linear layers and host attention both ask.
pub(crate) fn spreads(macs: usize) -> bool {
    SPREAD.with(Cell::get) && macs >= PARALLEL_MIN_MACS && rayon::current_num_threads() > 1
}

/// Runs `f` with this thread's linear layers and host attention kept on this thread.
pub fn single_threaded<T>(f: impl FnOnce() -> T) -> T {
    let before = SPREAD.with(|s| s.replace(false));
    let out = f();
    SPREAD.with(|s| s.set(before));
    out
}

/// Runs `f` on a thread of rayon's pool, so that the linear layers it calls fork-join within the
/// pool (workers spin briefly for work before they sleep) instead of waking it from outside and
/// blocking on every layer: a single-stream decoding step makes ~200 such calls.
pub fn in_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::scope(|_| f())
}
