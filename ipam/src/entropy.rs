//! Where the protocol's random choices come from (which free address after a lost race, backoff jitter).
//!
//! In production, from std's per-process random hasher keys, so concurrent invocations choose differently.
//! Property tests [`seed_thread`] so that a failing case replays exactly.

use std::cell::Cell;
use std::hash::{BuildHasher as _, Hasher as _};

thread_local! {
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// From now on, on this thread, [`random`] is a deterministic sequence starting from `seed`. For tests only.
pub fn seed_thread(seed: u64) {
    SEEDED.with(|s| s.set(Some(seed)));
}

/// A random number, mixed with `salt`.
pub fn random(salt: &[u8]) -> u64 {
    if let Some(seed) = SEEDED.with(Cell::get) {
        let next = step(seed);
        SEEDED.with(|s| s.set(Some(next)));
        let mut h = std::hash::DefaultHasher::new();
        h.write_u64(next);
        h.write(salt);
        return h.finish();
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(salt);
    h.finish()
}

/// The number after `seed` in a sequence of picks (Knuth's MMIX linear congruential step): a loop that picks again
/// after a lost race takes its next pick from its last.
pub fn step(seed: u64) -> u64 {
    seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407)
}
