//! [`prefetch_bytes`]: asking for memory ahead of the loops that read it (attention's
//! rows, quantised weight blocks).

/// How many rows ahead attention's row loops ask for their data: the rows of a
/// sequence's cache lie in scattered blocks, which the hardware prefetcher does not
/// follow, so without it the loops wait on memory at every block. Two 16-row blocks:
/// one block ahead (about 50 ns of work) is shorter than a DRAM access.
pub(super) const PREFETCH_ROWS: usize = 32;

/// Prefetches the cache lines of `len` bytes at `at` into L2 (a hint: it reads
/// nothing and never faults, whatever the address). Into L2, not L1 (`T1`): on Zen 4
/// the same requests into L1 (`T0`) ran attention at 22–28 ns a (head, key) against
/// 14–17 (`attention_speed 1024 16 0`, best of 15, alternated), as if they queued
/// behind L1's few outstanding misses; from L2 the row's loads a few hundred cycles
/// later hit.
#[inline(always)]
pub(super) fn prefetch_bytes(at: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let mut i = 0;
        while i < len {
            // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
            unsafe { _mm_prefetch(at.wrapping_add(i) as *const i8, _MM_HINT_T1) };
            i += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}
