//! Handing freed heap memory back to the system ([`release_free_memory`]).

/// Hands the pages of freed heap memory back to the system (glibc's `malloc_trim`; nothing
/// elsewhere). Called when a large allocation has just been freed: a model's host weights once it
/// is built, a pass's key-value caches, a model once it is done.
///
/// glibc keeps freed heap memory resident, and the large buffers here (weight panels of 1–2 MiB,
/// key-value caches of a few MiB per layer, host weight tensors) come from the heap once its
/// dynamic mmap threshold has grown past them; without this an evaluation's resident memory kept
/// the f32 host copy a variant was built from through the whole variant's run (600 MB for
/// SmolLM2). A fixed `M_MMAP_THRESHOLD` would return them too, but made every decoding step map
/// and unmap its logits (20% slower).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
