//! Geometry and policy of the cache, fixed when the manager is built.

use crate::CacheError;

/// How the KV cache and, for hybrid models, the Mamba snapshot pool are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block (`B`). Block boundaries are where hybrid models snapshot their
    /// recurrent state; the runner advances that state per token, so any size works.
    pub block_size: usize,
    /// Physical KV blocks, scratch blocks included.
    pub num_blocks: usize,
    /// Blocks reserved for dummy forwards (the idle heartbeat). They are the last
    /// `num_scratch_blocks` ids, never handed to a request and never evicted.
    pub num_scratch_blocks: usize,
    /// Whether finished blocks stay matchable. Off: nothing is hashed, matched or published.
    pub enable_prefix_caching: bool,
    /// Whether the model's per-token math differs between prompt and generated positions
    /// (Nemotron-H clamps dt only in prefill), so a block's hash must record which of its
    /// positions were generated.
    pub hash_generated_positions: bool,
    /// Whether a new request whose prefix another request is computing right now waits one step
    /// for that work to be published instead of computing it a second time.
    pub defer_pending_siblings: bool,
    /// The Mamba snapshot pool; `Some` exactly when the model has Mamba layers.
    pub mamba: Option<MambaCacheConfig>,
}

/// The Mamba snapshot pool of a hybrid model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MambaCacheConfig {
    /// Snapshot slots: each holds every Mamba layer's conv and SSM state at one block boundary.
    pub num_snapshot_slots: usize,
}

impl CacheConfig {
    /// An attention-only cache with prefix caching on, no scratch blocks and sibling deferral on.
    pub fn attention(block_size: usize, num_blocks: usize) -> Self {
        Self {
            block_size,
            num_blocks,
            num_scratch_blocks: 0,
            enable_prefix_caching: true,
            hash_generated_positions: false,
            defer_pending_siblings: true,
            mamba: None,
        }
    }

    /// A hybrid cache: [`CacheConfig::attention`] plus a snapshot pool of `num_snapshot_slots`.
    pub fn hybrid(block_size: usize, num_blocks: usize, num_snapshot_slots: usize) -> Self {
        Self {
            mamba: Some(MambaCacheConfig { num_snapshot_slots }),
            ..Self::attention(block_size, num_blocks)
        }
    }

    /// Blocks a request can be given: all but the scratch blocks.
    pub fn num_usable_blocks(&self) -> usize {
        self.num_blocks.saturating_sub(self.num_scratch_blocks)
    }

    /// Whether the model has Mamba layers.
    pub fn is_hybrid(&self) -> bool {
        self.mamba.is_some()
    }

    pub(crate) fn validate(&self) -> Result<(), CacheError> {
        let invalid = |reason: &str| Err(CacheError::InvalidConfig(reason.to_owned()));
        if self.block_size == 0 {
            return invalid("block_size must be at least 1");
        }
        if self.num_usable_blocks() == 0 {
            return invalid("num_blocks must exceed num_scratch_blocks");
        }
        if u32::try_from(self.num_blocks).is_err() {
            return invalid("num_blocks must fit in a u32 block id");
        }
        if let Some(mamba) = &self.mamba {
            // A hybrid hit needs a snapshot; with no slot prefix caching could never skip a token.
            if self.enable_prefix_caching && mamba.num_snapshot_slots == 0 {
                return invalid(
                    "a hybrid model with prefix caching needs at least one snapshot slot",
                );
            }
            if u32::try_from(mamba.num_snapshot_slots).is_err() {
                return invalid("num_snapshot_slots must fit in a u32 slot id");
            }
        }
        Ok(())
    }
}
