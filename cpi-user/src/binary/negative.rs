//! Failures remembered so a bad file is not read again at each sample, bounded: any
//! local user can make the agent meet thousands of distinct unusable files (each named by
//! a path of up to 4 KiB), and each remembered failure holds its message. The oldest
//! leave first, past [`MAX_FAILURES`] entries or [`MAX_FAILURE_BYTES`] bytes; the
//! symbolizer counts their bytes in its cache and drops them when its bound asks
//! (cpi-user/src/binary/symbolize.rs). A forgotten failure costs one more try of the file.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Failures one cache remembers at most.
pub(crate) const MAX_FAILURES: usize = 1024;

/// Bytes of failures one cache holds at most: 1024 short paths, or 256 of the longest.
pub(crate) const MAX_FAILURE_BYTES: u64 = 1 << 20;

/// Failures by key, oldest out first.
pub(crate) struct Failures<K, V> {
    entries: HashMap<K, (V, u64, u64)>,
    /// Insertion number → key, oldest first.
    order: BTreeMap<u64, K>,
    next: u64,
    bytes: u64,
}

impl<K, V> Default for Failures<K, V> {
    fn default() -> Self {
        Failures {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            bytes: 0,
        }
    }
}

/// Heap bytes of an entry besides its value's own heap: the key, value, size and
/// insertion number in both maps.
const fn entry_bytes<K, V>() -> u64 {
    (2 * size_of::<K>() + size_of::<V>() + 3 * size_of::<u64>()) as u64
}

impl<K: Hash + Eq + Clone, V> Failures<K, V> {
    /// The failure at `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(v, _, _)| v)
    }

    /// Remembers `value` (`heap` bytes on the heap) at `key`, then forgets the oldest
    /// while over either bound.
    pub fn insert(&mut self, key: K, value: V, heap: usize) {
        self.remove(&key);
        let bytes = heap as u64 + entry_bytes::<K, V>();
        self.next += 1;
        self.order.insert(self.next, key.clone());
        self.entries.insert(key, (value, bytes, self.next));
        self.bytes += bytes;
        while self.entries.len() > MAX_FAILURES || self.bytes > MAX_FAILURE_BYTES {
            self.pop_oldest();
        }
    }

    /// Forgets the failure at `key`.
    pub fn remove(&mut self, key: &K) {
        if let Some((_, bytes, n)) = self.entries.remove(key) {
            self.order.remove(&n);
            self.bytes -= bytes;
        }
    }

    /// Forgets the oldest failure; its bytes, or `None` if there was none.
    pub(crate) fn pop_oldest(&mut self) -> Option<u64> {
        let (_, key) = self.order.pop_first()?;
        let (_, bytes, _) = self.entries.remove(&key).expect("ordered keys are held");
        self.bytes -= bytes;
        Some(bytes)
    }

    /// Keeps only the failures whose key `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let (order, bytes) = (&mut self.order, &mut self.bytes);
        self.entries.retain(|k, (_, b, n)| {
            let kept = keep(k);
            if !kept {
                order.remove(n);
                *bytes -= *b;
            }
            kept
        });
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past either bound the oldest leave; what is held is counted.
    #[test]
    fn failures_stay_bounded_oldest_out_first() {
        let mut f = Failures::default();
        for i in 0..(3 * MAX_FAILURES as u32) {
            f.insert(i, (), 10);
        }
        assert_eq!(f.entries.len(), MAX_FAILURES);
        assert!(f.get(&0).is_none() && f.get(&(3 * MAX_FAILURES as u32 - 1)).is_some());
        assert_eq!(
            f.bytes(),
            MAX_FAILURES as u64 * (10 + entry_bytes::<u32, ()>())
        );
        // Long messages: the byte bound.
        for i in 0..MAX_FAILURES as u32 {
            f.insert(i, (), 4096);
        }
        assert!(f.bytes() <= MAX_FAILURE_BYTES && f.entries.len() < MAX_FAILURES / 2);
        f.retain(|_| false);
        assert_eq!((f.bytes(), f.order.len(), f.pop_oldest()), (0, 0, None));
    }
}
