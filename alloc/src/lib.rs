//! gpuctl-alloc: the allocator's settings that every binary that plans shares: the
//! daemon, the simulator (`gpuctl-sim`) and the benchmarks. A crate of its own so that
//! only they link mimalloc: in `gpuctl-sched` behind a feature, the feature was unified
//! into every binary built beside the daemon, and the CLI and the agent linked mimalloc
//! and ran its start-up (`gpuctl --version` 1.43 -> 1.52 ms, measured).
//!
//! They run with mimalloc (`#[global_allocator]` in each binary). A scheduling pass
//! allocates tens of megabytes (per-shape caches, calendars, tail heaps) and frees them
//! at its end; by default mimalloc gives freed pages back to the kernel 10 ms later, so
//! the next pass, a second later, faults them in again (zeroed by the kernel: a tenth of
//! a 100,000-job pass, measured with `perf`). Keeping freed pages for a second spares
//! that; the memory stays counted as the process's while it is kept.

/// mimalloc's `mi_option_purge_delay` (its `mi_option_e` in mimalloc.h, v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the kernel only after `ms` milliseconds unused.
pub fn keep_freed_memory(ms: i64) {
    // SAFETY: mi_option_set only stores the option's value (read by mimalloc's purge
    // logic); it takes no pointers and may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms as std::ffi::c_long) }
}

/// The setting every gpuctl binary that plans uses: one second.
pub fn tune() {
    keep_freed_memory(1000);
}
