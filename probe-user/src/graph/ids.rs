//! Stable ids for open waits: the same wait gets the same id in its `stall`
//! lines and in the incidents that list it, whichever source reported it.
//!
//! One book for the whole process (ids are unique across sources), bounded:
//! past [`MAX`] entries the least recently named half is forgotten.

use super::model::WaitKey;
use std::{collections::HashMap, sync::Mutex};

/// Most waits named at once.
pub const MAX: usize = 65_536;

struct Book {
    next: u64,
    touch: u64,
    ids: HashMap<WaitKey, (u64, u64)>,
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

/// The id of `key`: the one it was given before, or a new one.
pub fn id_of(key: WaitKey) -> u64 {
    let mut guard = match BOOK.lock() {
        Ok(b) => b,
        Err(poisoned) => poisoned.into_inner(),
    };
    let b = guard.get_or_insert_with(|| Book { next: 1, touch: 0, ids: HashMap::new() });
    b.touch += 1;
    let touch = b.touch;
    if let Some(e) = b.ids.get_mut(&key) {
        e.1 = touch;
        return e.0;
    }
    if b.ids.len() >= MAX {
        let mut touches: Vec<u64> = b.ids.values().map(|e| e.1).collect();
        touches.sort_unstable();
        let cut = touches[touches.len() / 2];
        b.ids.retain(|_, e| e.1 > cut);
    }
    let id = b.next;
    b.next += 1;
    b.ids.insert(key, (id, touch));
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_keeps_its_id_and_new_keys_get_new_ones() {
        let a = WaitKey::Kernel { tid: u32::MAX, start_ns: 1 };
        let b = WaitKey::Go { tgid: u32::MAX, g: 1, func: 2, start_ns: 3 };
        let ia = id_of(a);
        let ib = id_of(b);
        assert_ne!(ia, ib);
        assert_eq!(id_of(a), ia);
        assert_eq!(id_of(b), ib);
    }
}
