//! The memory a compact table's entries live in
//! (docs/performance.md#huge-pages-for-large-tables).
//!
//! A lookup in a large table touches one cache line at a random place, so
//! on 4 KiB pages it also misses the TLB: a table of 50 MB spans 12 000
//! pages and the TLB holds a few thousand. The page walk that follows
//! costs as much as the line itself, twice as much in a virtual machine
//! (two page tables). On 2 MiB pages the same table is 25 entries of the
//! TLB. So a table of at least 2 MiB is allocated aligned to 2 MiB and
//! advised to the kernel as wanting transparent huge pages
//! (`MADV_HUGEPAGE`) before its pages are first touched; smaller tables
//! stay on ordinary pages, where a huge page would be mostly empty.
//!
//! Such a table is mapped from the kernel directly (`mmap`), not taken
//! from the allocator: memory the allocator reuses has usually been
//! touched already, in 4 KiB pages, and advice given after the fact only
//! helps when the kernel's background collapsing gets to it. Freed, the
//! mapping goes straight back to the kernel. The bytes so mapped are
//! counted ([`mapped_bytes`]) since no allocator sees them.
//!
//! Whether the kernel grants the advice is its choice (the system's
//! `transparent_hugepage` setting, free memory); the table works the same
//! either way.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The size of a huge page on x86-64 and aarch64 (4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// An array of `T`, at least cache-line aligned, on huge pages from
/// [`HUGE_PAGE`] up where the kernel allows: a `Box<[T]>` with a choice of
/// memory.
pub(super) struct Lines<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
    /// Mapped from the kernel ([`map_huge`]) rather than allocated.
    mapped: bool,
}

// SAFETY: `Lines` owns its array as a `Box<[T]>` would.
unsafe impl<T: Copy + Send> Send for Lines<T> {}
// SAFETY: as above; shared access only reads.
unsafe impl<T: Copy + Sync> Sync for Lines<T> {}

impl<T: Copy> Default for Lines<T> {
    fn default() -> Self {
        Lines {
            ptr: NonNull::dangling(),
            len: 0,
            mapped: false,
        }
    }
}

static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// Bytes of the memory stores' large tables, which are mapped from the
/// kernel outside the allocator (every store of this process).
pub fn mapped_bytes() -> usize {
    MAPPED.load(Ordering::Relaxed)
}

impl<T: Copy> Lines<T> {
    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Self {
        let Some(layout) = Self::layout(len) else {
            // As `Vec` does: a size past `isize::MAX` is a bug, not an
            // input (the key cap bounds every table far below it).
            assert!(len == 0 || size_of::<T>() == 0, "capacity overflow");
            return Self::default();
        };
        let mapped = Self::mapping_length(layout).and_then(map_huge);
        let raw = match mapped {
            Some(start) => start,
            // SAFETY: the layout's size is not zero (`layout` says so).
            None => unsafe { alloc(layout) },
        };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
            handle_alloc_error(layout)
        };
        for index in 0..len {
            // SAFETY: `ptr` is fresh memory with room and alignment for
            // `len` values of `T`. Writing them is also what first touches
            // the pages, after the advice.
            unsafe { ptr.add(index).write(value) };
        }
        Lines {
            ptr,
            len,
            mapped: mapped.is_some(),
        }
    }

    /// The allocator's layout for `len` values; `None` when there is
    /// nothing to allocate.
    fn layout(len: usize) -> Option<Layout> {
        let size = len.checked_mul(size_of::<T>())?;
        if size == 0 {
            return None;
        }
        Layout::from_size_align(size, align_of::<T>().max(64)).ok()
    }

    /// How much to map for an array of `layout`: whole huge pages, from
    /// one huge page up; `None` below that.
    fn mapping_length(layout: Layout) -> Option<usize> {
        if layout.size() < HUGE_PAGE {
            return None;
        }
        layout.size().checked_next_multiple_of(HUGE_PAGE)
    }
}

impl<T: Copy> Drop for Lines<T> {
    fn drop(&mut self) {
        let Some(layout) = Self::layout(self.len) else {
            return;
        };
        if self.mapped {
            if let Some(length) = Self::mapping_length(layout) {
                unmap_huge(self.ptr.as_ptr().cast(), length);
            }
        } else {
            // SAFETY: allocated in `filled` with this same layout.
            unsafe { dealloc(self.ptr.as_ptr().cast(), layout) }
        }
    }
}

impl<T: Copy> Deref for Lines<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised values (or is dangling
        // with `len` 0), owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A fresh, zeroed mapping of `length` bytes (a multiple of
/// [`HUGE_PAGE`]) aligned to [`HUGE_PAGE`] and advised for huge pages;
/// `None` if the kernel refuses it.
#[cfg(target_os = "linux")]
fn map_huge(length: usize) -> Option<*mut u8> {
    let span = length.checked_add(HUGE_PAGE)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no memory of this process.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let raw = raw.cast::<u8>();
    let lead = (raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize;
    let trail = span - lead - length;
    // SAFETY: the lead and the trail are the parts of the mapping just
    // made that fall outside the aligned range kept; nothing refers to
    // them. Unmapping or advising a part of a fresh mapping cannot fail in
    // a way that matters: at worst the memory stays mapped, or on small
    // pages.
    unsafe {
        let start = raw.add(lead);
        if lead > 0 {
            libc::munmap(raw.cast(), lead);
        }
        if trail > 0 {
            libc::munmap(start.add(length).cast(), trail);
        }
        libc::madvise(start.cast(), length, libc::MADV_HUGEPAGE);
        MAPPED.fetch_add(length, Ordering::Relaxed);
        Some(start)
    }
}

#[cfg(not(target_os = "linux"))]
fn map_huge(_length: usize) -> Option<*mut u8> {
    None
}

#[cfg(target_os = "linux")]
fn unmap_huge(start: *mut u8, length: usize) {
    // SAFETY: `start..start + length` is a mapping `map_huge` made, owned
    // by the array being dropped.
    unsafe {
        libc::munmap(start.cast(), length);
    }
    MAPPED.fetch_sub(length, Ordering::Relaxed);
}

#[cfg(not(target_os = "linux"))]
fn unmap_huge(_start: *mut u8, _length: usize) {
    // Nothing is ever mapped here (`map_huge` says no).
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u64; 8]);

    #[test]
    fn small_and_large_arrays_are_filled_aligned_and_writable() {
        for len in [0, 1, 4, HUGE_PAGE / 64, 3 * HUGE_PAGE / 64] {
            let mut lines = Lines::filled(len, Line([5; 8]));
            assert_eq!(lines.len(), len);
            assert!(lines.iter().all(|line| line.0 == [5; 8]));
            if len > 0 {
                let huge = cfg!(target_os = "linux") && len * 64 >= HUGE_PAGE;
                let align = if huge { HUGE_PAGE } else { 64 };
                assert_eq!(lines.as_ptr() as usize % align, 0);
                lines[len - 1].0[7] = 7;
                assert_eq!(lines[len - 1].0[7], 7);
            }
        }
    }

    /// The kernel records the advice in the mapping's flags (`hg` in
    /// `/proc/self/smaps`), whether or not it has huge pages to give.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_array_is_advised_for_huge_pages_and_a_small_one_is_not() {
        let flags_at = |address: usize| -> Option<String> {
            let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
            let mut inside = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ')
                    && let Some((start, end)) = range.split_once('-')
                    && let (Ok(start), Ok(end)) = (
                        usize::from_str_radix(start, 16),
                        usize::from_str_radix(end, 16),
                    )
                {
                    inside = (start..end).contains(&address);
                } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.to_owned());
                }
            }
            None
        };
        let large = Lines::filled(2 * HUGE_PAGE / 64, Line([0; 8]));
        let flags = flags_at(large.as_ptr() as usize).expect("the array is mapped");
        assert!(flags.split_whitespace().any(|flag| flag == "hg"), "{flags}");
        assert!(large.mapped && mapped_bytes() >= 2 * HUGE_PAGE);
        let small = Lines::filled(HUGE_PAGE / 64 - 1, Line([0; 8]));
        let flags = flags_at(small.as_ptr() as usize).expect("the array is mapped");
        assert!(
            !flags.split_whitespace().any(|flag| flag == "hg"),
            "{flags}"
        );
        assert!(!small.mapped);
    }
}
