//! The allocator tpusim's processes use: small blocks from mimalloc, large ones from the system
//! allocator.
//!
//! Lowering builds step bodies of thousands of small nodes and dependency lists; mimalloc serves
//! those at a fraction of the system allocator's cost. It also keeps pages of each size class
//! for its own reuse, and a sweep's large buffers (bodies, plans and indexes of hundreds of KiB,
//! in many sizes as vectors grow) then hold two to three times the live heap: the video-10k sweep
//! peaked at 120 MB for a 58 MB heap. The system allocator coalesces freed blocks of any size,
//! so large buffers go there ([`LARGE_BYTES`]). Measured side by side on one 2-core machine
//! (issue 47; figures in its closing note): the split keeps the sweeps' speed and brings their
//! peak resident memory to about 1.3x the heap.
//!
//! [`tune_process_heap`] sets the system heap's policy for a process that owns its heap (the
//! `tpusim` binary and the bench binaries; not the Python extension, whose process is Python's).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of this many bytes or more come from the system allocator; smaller ones from mimalloc.
///
/// 4 KiB: below it are the bodies' nodes, edges and small vectors, where mimalloc's speed pays;
/// above it the retained pages of mimalloc's medium and large size classes made the excess.
pub const LARGE_BYTES: usize = 4096;

/// The split allocator: `#[global_allocator] static A: tpusim_io::alloc::Split = tpusim_io::alloc::Split;`.
///
/// Which heap a block belongs to follows from its size alone, which `GlobalAlloc` guarantees is
/// the same at `dealloc` and `realloc` as when it was allocated; a `realloc` across
/// [`LARGE_BYTES`] moves the block to the other heap.
pub struct Split;

static MI: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[inline]
fn large(size: usize) -> bool {
    size >= LARGE_BYTES
}

// SAFETY: every block is freed, grown or shrunk by the allocator that gave it, chosen from its
// layout's size, which the caller must pass unchanged (GlobalAlloc's contract).
unsafe impl GlobalAlloc for Split {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if large(layout.size()) {
            System.alloc(layout)
        } else {
            MI.alloc(layout)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if large(layout.size()) {
            System.alloc_zeroed(layout)
        } else {
            MI.alloc_zeroed(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if large(layout.size()) {
            System.dealloc(ptr, layout)
        } else {
            MI.dealloc(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (large(layout.size()), large(new_size)) {
            (true, true) => System.realloc(ptr, layout, new_size),
            (false, false) => MI.realloc(ptr, layout, new_size),
            _ => {
                // SAFETY: the caller guarantees new_size, rounded up to the alignment, does not
                // overflow isize (GlobalAlloc::realloc's contract).
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

/// Sets the system heap's policy for a process that owns its heap; call first thing in `main`.
///
/// On glibc: one arena (M_ARENA_MAX = 1; a sweep's threads otherwise each keep their own
/// peak), and large blocks from the heap rather than fresh mappings (M_MMAP_THRESHOLD = 64 MiB)
/// with free memory kept up to 64 MiB (M_TRIM_THRESHOLD), so a body's buffers are reused
/// instead of mapped, faulted in and unmapped for every point (the system time that otherwise
/// cost 1 s of a 6 s sweep). Elsewhere it does nothing. (Setting mimalloc to return its pages
/// sooner, `purge_delay` 10 ms, was tried: it cost calibrate 0.5 to 1 s of system time and
/// changed no peak beyond the run-to-run spread.)
pub fn tune_process_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets glibc's malloc parameters; a refusal returns 0 and leaves
        // the default, which is still correct, only larger.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks that cross the threshold by realloc keep their bytes and are freed by the heap
    /// that holds them (a wrong heap would abort the test process).
    #[test]
    fn blocks_keep_their_bytes_across_the_threshold() {
        for &(from, to) in &[(16, LARGE_BYTES * 4), (LARGE_BYTES * 4, 16), (LARGE_BYTES - 1, LARGE_BYTES)] {
            let layout = Layout::from_size_align(from, 8).unwrap();
            unsafe {
                let p = Split.alloc(layout);
                assert!(!p.is_null());
                for i in 0..from {
                    *p.add(i) = (i % 251) as u8;
                }
                let q = Split.realloc(p, layout, to);
                assert!(!q.is_null());
                for i in 0..from.min(to) {
                    assert_eq!(*q.add(i), (i % 251) as u8, "byte {i} of {from} -> {to}");
                }
                Split.dealloc(q, Layout::from_size_align(to, 8).unwrap());
            }
        }
        let z = Layout::from_size_align(LARGE_BYTES * 2, 64).unwrap();
        unsafe {
            let p = Split.alloc_zeroed(z);
            assert!(!p.is_null() && (p as usize).is_multiple_of(64));
            assert!((0..z.size()).all(|i| *p.add(i) == 0));
            Split.dealloc(p, z);
        }
    }
}
