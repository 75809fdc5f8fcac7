//! [`WeightBytes`]: the zeroed byte buffer the packed weights live in, backed by
//! transparent huge pages where the operating system hands them out on request.
//!
//! Every decode pass streams every packed weight byte (98 MB for SmolLM2-135M). In
//! 4 KiB pages that is about 25,000 pages, far beyond what the TLB holds, so each pass
//! also walks the page tables; in 2 MiB pages it is about 50. Linux gives anonymous
//! memory huge pages either always or only where a program asks (`madvise`, the
//! default of many distributions and of the machine this was measured on). The buffer
//! asks before its first byte is written, so the first touch can fault in huge pages,
//! and maps whole 2 MiB multiples, which the kernel places on 2 MiB boundaries. On the
//! session-9 Xeon (THP `madvise`) this took the settled 1-row pass of SmolLM2 from
//! 3.04–3.56 ms to 2.94–3.12 ms over four alternations (ARCHITECTURE.md, README).
//!
//! Below 2 MiB, off Linux, or when the map fails it is an ordinary heap buffer; a kernel
//! without THP keeps the map in small pages. The bytes, and therefore every result, are
//! the same either way.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// A zeroed, fixed-length byte buffer for large read-mostly data (see the module).
pub struct WeightBytes {
    storage: Storage,
    len: usize,
}

enum Storage {
    /// An anonymous map of whole huge pages (its first `len` bytes are the buffer), and
    /// whether the kernel took the advice to back it with huge pages.
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        advised: bool,
    },
    Heap(Vec<u8>),
}

/// Below this a buffer cannot hold one huge page: the heap serves it.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

impl WeightBytes {
    /// `len` zero bytes, in huge pages where the system offers them.
    pub fn zeroed(len: usize) -> WeightBytes {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE {
            let mapped = len
                .checked_next_multiple_of(HUGE_PAGE)
                .map(memmap2::MmapMut::map_anon);
            if let Some(Ok(map)) = mapped {
                // Advice only: a kernel without THP refuses it and the pages stay small.
                let advised = map.advise(memmap2::Advice::HugePage).is_ok();
                return WeightBytes {
                    storage: Storage::Mapped { map, advised },
                    len,
                };
            }
        }
        WeightBytes {
            storage: Storage::Heap(vec![0; len]),
            len,
        }
    }

    /// Whether the buffer is a map the kernel accepted the huge-page advice for (rather
    /// than heap memory, or a map in small pages).
    pub fn advised_huge(&self) -> bool {
        match &self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped { advised, .. } => *advised,
            Storage::Heap(_) => false,
        }
    }
}

impl Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped { map, .. } => &map[..self.len],
            Storage::Heap(v) => v,
        }
    }
}

impl DerefMut for WeightBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            #[cfg(target_os = "linux")]
            Storage::Mapped { map, .. } => &mut map[..self.len],
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
