//! Newtype ids. Each is a distinct type so a block id can never be passed where a request id or a
//! snapshot slot is expected.

use std::fmt;

/// A token id in the model's vocabulary.
pub type TokenId = u32;

macro_rules! newtype_id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[derive(serde::Serialize, serde::Deserialize)]
        pub struct $name(pub $inner);

        impl $name {
            /// The id as an index into a dense table.
            #[inline]
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

newtype_id!(
    /// Identifies one submitted request for its whole life in the engine. A request samples `n`
    /// continuations, each its own sequence ([`SeqId`]).
    RequestId(u64)
);
newtype_id!(
    /// Identifies one sequence: one sampled continuation of a request. The scheduler, the cache
    /// manager and the runners deal in sequences; only the API deals in requests.
    SeqId(u64)
);
newtype_id!(
    /// A physical KV block: `block_size` consecutive token slots in every attention layer.
    BlockId(u32)
);
newtype_id!(
    /// Bumped every time a block is handed to a new owner, so data written for a previous owner
    /// (late routing rows, say) can be recognised and dropped.
    BlockGeneration(u32)
);
newtype_id!(
    /// A slot in the Mamba snapshot pool: one copy of every Mamba layer's conv and SSM state.
    SnapshotSlotId(u32)
);

impl SeqId {
    /// Most sequences one request may have: the index takes the low 8 bits of the id.
    pub const MAX_PER_REQUEST: usize = 256;

    /// Sequence `index` of `request`. Ids pack `request << 8 | index`, so the request and the index
    /// come back without a lookup table.
    pub fn new(request: RequestId, index: usize) -> Self {
        debug_assert!(index < Self::MAX_PER_REQUEST, "sequence index {index} out of range");
        Self(request.0 << 8 | index as u64)
    }

    /// The request this sequence belongs to.
    pub fn request(self) -> RequestId {
        RequestId(self.0 >> 8)
    }

    /// Which of its request's continuations this is.
    pub fn index_in_request(self) -> usize {
        (self.0 & 0xff) as usize
    }
}

/// A KV block together with the generation it had when it was handed out. Data written for a block
/// (routing rows, say) is keyed by both, so a late write for a previous owner is recognised and
/// dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockRef {
    /// The physical block.
    pub block: BlockId,
    /// Its generation.
    pub generation: BlockGeneration,
}

impl BlockRef {
    /// `block` at `generation`.
    pub const fn new(block: BlockId, generation: BlockGeneration) -> Self {
        Self { block, generation }
    }
}

/// The chained content hash of a complete KV block: 128 bits over the parent block's hash, the
/// block's token ids and its extra keys. Stable across runs and processes.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct BlockHash(pub u128);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:032x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_id_gives_back_its_request_and_index() {
        for (request, index) in [(0, 0), (1, 0), (7, 127), (u64::MAX >> 8, 255)] {
            let seq = SeqId::new(RequestId(request), index);
            assert_eq!(seq.request(), RequestId(request));
            assert_eq!(seq.index_in_request(), index);
        }
        assert_ne!(SeqId::new(RequestId(1), 0), SeqId::new(RequestId(0), 1));
    }
}
