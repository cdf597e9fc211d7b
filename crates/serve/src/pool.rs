//! Requests in parallel, at most N at once, answers in the order asked.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs `work` on every item with at most `concurrency` threads, and returns the results in the
/// items' order, or the error of the first item (in item order) that failed. After a failure no
/// new item starts; items in flight finish.
///
/// # Errors
/// The first error `work` returned, by item index.
pub fn run_bounded<T, R, E, F>(items: &[T], concurrency: usize, work: F) -> Result<Vec<R>, E>
where
    T: Sync,
    R: Send,
    E: Send,
    F: Fn(&T) -> Result<R, E> + Sync,
{
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<R, E>>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let threads = concurrency.clamp(1, items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    if failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let result = work(item);
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    // A poisoned lock means another worker panicked; its panic ends the scope.
                    if let Ok(mut slots) = results.lock() {
                        slots[i] = Some(result);
                    }
                }
            });
        }
    });
    let slots = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out = Vec::with_capacity(items.len());
    for slot in slots {
        match slot {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => return Err(e),
            // Not started after a failure: the failure comes first in item order or is below.
            None => continue,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_and_concurrency_is_bounded() {
        let in_flight = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let items: Vec<u32> = (0..40).collect();
        let out: Result<Vec<u32>, ()> = run_bounded(&items, 3, |&i| {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(u64::from(i % 3)));
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(i * 2)
        });
        assert_eq!(out.unwrap(), items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert!(peak.load(Ordering::SeqCst) <= 3);
    }

    #[test]
    fn the_first_error_in_item_order_is_returned() {
        let items: Vec<u32> = (0..10).collect();
        let out = run_bounded(&items, 1, |&i| if i >= 4 { Err(i) } else { Ok(i) });
        assert_eq!(out, Err(4));
        let out: Result<Vec<u32>, u32> = run_bounded(&[], 4, |&i: &u32| Ok(i));
        assert_eq!(out, Ok(vec![]));
    }
}
