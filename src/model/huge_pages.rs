//! Large, long-lived buffers (the KV pool) backed by 2 MiB pages where Linux allows
//! it. (Asked for the packed weights too, it measured no different: most matrices are
//! smaller than a huge page.)
//!
//! Attention reads each sequence's K/V from blocks scattered through a pool of
//! gigabytes, and with 4 KiB pages nearly every block costs TLB misses and page walks
//! on top of its DRAM reads; the hardware prefetcher also stops at every 4 KiB edge.
//! Most distributions ship transparent huge pages in `madvise` mode, so a buffer gets
//! them only when asked: [`advise`] asks. It is advice: where the kernel has no huge
//! pages to give (or on other systems) nothing changes, and results never depend on it.

/// Huge-page size on x86-64 and most aarch64 kernels; only alignment depends on it.
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside `buf` with huge pages once
/// they are first touched (`madvise(MADV_HUGEPAGE)`). Call it before writing the
/// buffer: pages already faulted in stay small until the kernel's background
/// collapser gets to them. Returns whether the advice was taken (false for buffers
/// smaller than a huge page, off Linux, or if the kernel refuses).
pub fn advise<T>(buf: &[T]) -> bool {
    let start = buf.as_ptr() as usize;
    let end = start + std::mem::size_of_val(buf);
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = end / HUGE_PAGE * HUGE_PAGE;
    if last <= first {
        return false;
    }
    advise_range(first, last - first)
}

#[cfg(target_os = "linux")]
fn advise_range(at: usize, len: usize) -> bool {
    // SAFETY: `at..at + len` lies inside a live allocation the caller borrows;
    // MADV_HUGEPAGE changes only how the kernel backs it, never its contents.
    unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_HUGEPAGE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn advise_range(_at: usize, _len: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_huge_pages_inside_a_buffer_are_advised() {
        // Smaller than one huge page: nothing to advise.
        assert!(!advise(&vec![0u8; HUGE_PAGE - 1]));
        assert!(!advise::<f32>(&[]));
        // Three huge pages' worth holds at least two whole aligned ones.
        let big = vec![0f32; 3 * HUGE_PAGE / 4];
        let taken = advise(&big);
        if cfg!(target_os = "linux")
            && std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
        {
            assert!(taken, "madvise(MADV_HUGEPAGE) refused on a kernel with THP");
        } else {
            assert!(!taken);
        }
    }
}
