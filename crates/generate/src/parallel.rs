//! Running independent batches on several CPU threads.
//!
//! Burn's CPU backend (flex) runs the small matrices of a decoding step on one thread, so a
//! 2-core machine idles half its time; batches of prompts are independent (each row's results
//! depend on that row alone), so they can run side by side. std's scoped threads suffice here:
//! one task per batch, handed out in order.
//!
//! **Invariant: results come back in batch order whatever the thread count; observers are called
//! one at a time (behind a mutex).**

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// `work(i)` for every `i` in `0..n`, on up to `threads` threads; results in index order.
///
/// A panic in `work` propagates to the caller (scoped threads are joined).
pub(crate) fn run_batches<T: Send>(n: usize, threads: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        // One batch at a time: its linear layers spread over the cores, from inside the pool.
        let work = &work;
        return qdrift_model::in_pool(move || (0..n).map(work).collect());
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            // Each thread already keeps a core busy: its linear layers stay on it.
            s.spawn(|| {
                qdrift_model::single_threaded(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let result = work(i);
                        *lock(&slots[i]) = Some(result);
                    }
                })
            });
        }
    });
    // Every slot is filled: each index was taken by exactly one thread, and a thread that
    // panicked re-raised its panic when the scope joined it.
    slots.into_iter().filter_map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner)).collect()
}

/// Locks `m`, ignoring poisoning: a panic elsewhere already propagates through the scope.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_whatever_the_thread_count() {
        for threads in [1, 2, 3, 8] {
            let out = run_batches(7, threads, |i| i * i);
            assert_eq!(out, vec![0, 1, 4, 9, 16, 25, 36], "{threads} threads");
        }
        assert!(run_batches(0, 2, |i| i).is_empty());
    }

    #[test]
    fn work_really_runs_on_several_threads() {
        let ids = Mutex::new(std::collections::HashSet::new());
        let barrier = std::sync::Barrier::new(2);
        run_batches(2, 2, |_| {
            // Both tasks must be in flight at once to pass the barrier.
            barrier.wait();
            lock(&ids).insert(std::thread::current().id());
        });
        assert_eq!(lock(&ids).len(), 2);
    }
}
