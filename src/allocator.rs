//! The global allocator: mimalloc, entered by its plain `mi_malloc` where the alignment asked
//! for is one every mimalloc block has. The `mimalloc` crate enters by `mi_malloc_aligned` for
//! every allocation, whose alignment checks cost about as much again as the small-block path
//! itself, and the pipeline allocates a few small buffers per packet.

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// Every mimalloc block is aligned to a machine word: its smallest size class is a word and
/// every class is a multiple of one.
const BLOCK_ALIGN: usize = std::mem::size_of::<usize>();

pub struct Allocator;

// SAFETY: every path is mimalloc's own allocate/free pair for the same block: blocks from
// `mi_malloc`, `mi_zalloc` and `mi_realloc` are freed by `mi_free` like aligned ones, and an
// alignment above a word always takes the aligned entry points.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls; the caller gives a non-zero size.
        unsafe {
            if layout.align() <= BLOCK_ALIGN {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.align() <= BLOCK_ALIGN {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of the calls above (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is a live block of `layout` (the caller's contract).
        unsafe {
            if layout.align() <= BLOCK_ALIGN {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class up to a few pages, at every alignment, come back aligned,
    /// zeroed when asked, keep their bytes across a reallocation, and free.
    #[test]
    fn blocks_are_aligned_zeroed_and_kept_across_reallocation() {
        let a = Allocator;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in (1..=1100).step_by(7).chain([4096, 65_536, 1 << 20]) {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: a non-zero layout; each block is freed once, with its layout.
                unsafe {
                    let p = a.alloc_zeroed(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    assert!(std::slice::from_raw_parts(p, size).iter().all(|b| *b == 0));
                    p.write_bytes(0xa5, size);
                    let grown = a.realloc(p, layout, size * 2 + 24);
                    assert_eq!(grown as usize % align, 0, "size {size} align {align}");
                    assert!(
                        std::slice::from_raw_parts(grown, size)
                            .iter()
                            .all(|b| *b == 0xa5)
                    );
                    let bigger = Layout::from_size_align(size * 2 + 24, align).expect("layout");
                    a.dealloc(grown, bigger);
                    let q = a.alloc(layout);
                    assert_eq!(q as usize % align, 0, "size {size} align {align}");
                    a.dealloc(q, layout);
                }
            }
        }
    }
}
