//! A perf event's ring buffer mapped into memory, read as the kernel's
//! `perf_event_mmap_page` lays it out: the side-band buffers (collect/sideband.rs) and
//! the sample buffers of collection without root (collect/perf_ring.rs).

use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use crate::fsafe::page_size;

/// One mapped perf event ring buffer: the side-band buffers here, and the sample
/// buffers of collection without root (collect/perf_ring.rs).
pub(crate) struct Ring {
    base: NonNull<u8>,
    len: usize,
    page: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this length; nothing uses it after drop.
        unsafe { super::munmap_ring(self.base, self.len) };
    }
}

impl Ring {
    /// Maps `fd`'s buffer: the control page and `data_pages` (a power of two) of data.
    pub fn map(fd: &OwnedFd, data_pages: usize) -> io::Result<Ring> {
        let page = page_size();
        let len = page * (1 + data_pages);
        let base = super::mmap_ring(fd, len)?;
        Ok(Ring { base, len, page })
    }

    /// Every record written since the last call, oldest first, as `(type, misc, body)`
    /// (the body: what follows the 8-byte header, copied out of the ring into `scratch`).
    pub fn read(&self, scratch: &mut Vec<u8>, mut on: impl FnMut(u32, u16, &[u8])) {
        let data_size = (self.len - self.page) as u64;
        let ctl = self.base.as_ptr();
        // SAFETY: the control page's data_head (offset 1024) and data_tail (1032)
        // as the kernel's perf_event_mmap_page lays them out; head is read before
        // the data it covers (acquire), tail written after it was read (release).
        let head = unsafe { std::ptr::read_volatile(ctl.add(1024).cast::<u64>()) };
        fence(Ordering::Acquire);
        // SAFETY: data_tail, in the same mapped control page; only we write it.
        let mut tail = unsafe { std::ptr::read_volatile(ctl.add(1032).cast::<u64>()) };
        // SAFETY: the data area follows the control page, `data_size` bytes.
        let data = unsafe { std::slice::from_raw_parts(ctl.add(self.page), data_size as usize) };
        while head.saturating_sub(tail) >= 8 {
            let at = |off: u64| ((tail + off) % data_size) as usize;
            let mut hdr = [0u8; 8];
            for (i, byte) in hdr.iter_mut().enumerate() {
                *byte = data[at(i as u64)];
            }
            let kind = u32::from_ne_bytes(hdr[0..4].try_into().expect("4 bytes"));
            let misc = u16::from_ne_bytes(hdr[4..6].try_into().expect("2 bytes"));
            let size = u16::from_ne_bytes(hdr[6..8].try_into().expect("2 bytes")) as u64;
            if size < 8 || tail + size > head {
                break;
            }
            scratch.clear();
            scratch.extend((8..size).map(|i| data[at(i)]));
            on(kind, misc, scratch);
            tail += size;
        }
        fence(Ordering::Release);
        // SAFETY: as above; the kernel reads data_tail to know what is free.
        unsafe { std::ptr::write_volatile(ctl.add(1032).cast::<u64>(), tail) };
    }
}
