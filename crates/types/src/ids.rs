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
    /// Identifies one request (one sampled sequence) for its whole life in the engine.
    RequestId(u64)
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
