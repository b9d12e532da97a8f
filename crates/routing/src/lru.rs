//! An intrusive least-recently-released list over dense block indices.
//!
//! Links live in two arrays sized once for the whole pool, so moving a block in or out of the list
//! is O(1) and never allocates.

const NIL: u32 = u32::MAX;

/// Doubly linked list of block indices, oldest at the front.
#[derive(Debug)]
pub(crate) struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    /// An empty list able to hold indices `0..capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            linked: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Number of linked indices.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `index` is linked.
    #[cfg(test)]
    pub(crate) fn contains(&self, index: usize) -> bool {
        self.linked[index]
    }

    /// Links `index` at the back (most recent), moving it there if already linked.
    pub(crate) fn push_back(&mut self, index: usize) {
        self.remove(index);
        let i = index as u32;
        self.prev[index] = self.tail;
        self.next[index] = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.next[self.tail as usize] = i;
        }
        self.tail = i;
        self.linked[index] = true;
        self.len += 1;
    }

    /// Unlinks `index`; does nothing when it is not linked.
    pub(crate) fn remove(&mut self, index: usize) {
        if !self.linked[index] {
            return;
        }
        let (p, n) = (self.prev[index], self.next[index]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[index] = NIL;
        self.next[index] = NIL;
        self.linked[index] = false;
        self.len -= 1;
    }

    /// Unlinks and returns the oldest index.
    pub(crate) fn pop_front(&mut self) -> Option<usize> {
        if self.head == NIL {
            return None;
        }
        let index = self.head as usize;
        self.remove(index);
        Some(index)
    }

    /// Unlinks everything.
    pub(crate) fn clear(&mut self) {
        while self.pop_front().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn keeps_release_order_and_moves_on_repush() {
        let mut lru = Lru::new(5);
        for i in [3, 1, 4, 0] {
            lru.push_back(i);
        }
        lru.push_back(1);
        lru.remove(4);
        assert_eq!(lru.len(), 3);
        assert!(!lru.contains(4));
        let order: Vec<usize> = std::iter::from_fn(|| lru.pop_front()).collect();
        assert_eq!(order, [3, 0, 1]);
        assert_eq!(lru.len(), 0);
    }
}
