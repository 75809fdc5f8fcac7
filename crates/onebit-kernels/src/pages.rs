//! [`WeightBytes`]: the zeroed byte buffer the packed weights live in, backed by
//! transparent huge pages where the operating system hands them out on request.
//!
//! Every decode pass streams every packed weight byte (98 MB for SmolLM2-135M). In
//! 4 KiB pages that is about 25,000 pages, far beyond what the TLB holds, so each pass
//! also walks the page tables; in 2 MiB pages it is about 50. Linux gives anonymous
//! memory huge pages either always or only where a program asks (`madvise`, the
//! default of many distributions and of the machine this was measured on). The buffer
//! asks before its first byte is written, so the first touch can fault in huge pages.
//! On the session-9 Xeon (THP `madvise`) this took the settled 1-row pass of SmolLM2 from
//! 3.3–3.5 ms to 3.1–3.2 ms (ARCHITECTURE.md, README).
//!
//! Elsewhere (another OS, THP off, a failed map) it is an ordinary heap buffer: the
//! bytes, and therefore every result, are the same either way.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// A zeroed, fixed-length byte buffer for large read-mostly data (see the module).
pub struct WeightBytes {
    storage: Storage,
}

enum Storage {
    /// An anonymous map advised to use huge pages.
    #[cfg(target_os = "linux")]
    Mapped(memmap2::MmapMut),
    Heap(Vec<u8>),
}

/// Below this a buffer cannot hold one huge page: the heap serves it.
const HUGE_PAGE: usize = 2 << 20;

impl WeightBytes {
    /// `len` zero bytes, in huge pages where the system offers them.
    pub fn zeroed(len: usize) -> WeightBytes {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE {
            if let Ok(map) = memmap2::MmapMut::map_anon(len) {
                // Advice only: if the kernel has no THP the pages stay small.
                let _ = map.advise(memmap2::Advice::HugePage);
                return WeightBytes {
                    storage: Storage::Mapped(map),
                };
            }
        }
        WeightBytes {
            storage: Storage::Heap(vec![0; len]),
        }
    }

    /// Whether the buffer is a map advised to use huge pages (rather than heap memory).
    pub fn advised_huge(&self) -> bool {
        match &self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped(_) => true,
            Storage::Heap(_) => false,
        }
    }
}

impl Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped(map) => map,
            Storage::Heap(v) => v,
        }
    }
}

impl DerefMut for WeightBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped(map) => map,
            Storage::Heap(v) => v,
        }
    }
}

impl Clone for WeightBytes {
    fn clone(&self) -> WeightBytes {
        let mut copy = WeightBytes::zeroed(self.len());
        copy.copy_from_slice(self);
        copy
    }
}

impl fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightBytes")
            .field("len", &self.len())
            .field("advised_huge", &self.advised_huge())
            .finish()
    }
}
