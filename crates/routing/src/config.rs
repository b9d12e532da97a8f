//! The store's configuration and what its calls report back.

use routed_types::{BlockGeneration, BlockId, RoutingMeta};

use crate::error::LossReason;
#[cfg(doc)]
use crate::store::RoutingStore;

/// Sizes and limits of a [`RoutingStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingStoreConfig {
    /// KV blocks in the pool; block ids are `0..num_blocks`.
    pub num_blocks: usize,
    /// Token slots per KV block (rows per stored block).
    pub block_size: usize,
    /// MoE layers per row (`L`).
    pub num_moe_layers: usize,
    /// Experts per layer per token (`K`).
    pub top_k: usize,
    /// Routed experts per MoE layer; picks the stored width and bounds every id.
    pub num_experts: u32,
    /// Cap on the bytes of stored rows; `None` means room for every KV block.
    pub max_bytes: Option<usize>,
}

impl RoutingStoreConfig {
    /// A store for `meta`'s rows over a pool of `num_blocks` blocks of `block_size` slots, with
    /// room for every block.
    pub fn new(meta: &RoutingMeta, num_blocks: usize, block_size: usize) -> Self {
        Self {
            num_blocks,
            block_size,
            num_moe_layers: meta.num_moe_layers(),
            top_k: meta.top_k as usize,
            num_experts: meta.num_experts,
            max_bytes: None,
        }
    }

    /// The same store capped at `max_bytes` of rows.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// Bytes of one block's rows: `block_size * L * K` ids of the store's width.
    pub fn block_bytes(&self) -> usize {
        let width = crate::width::IdWidth::for_num_experts(self.num_experts);
        self.block_size * self.num_moe_layers * self.top_k * width.bytes()
    }
}

/// What one [`RoutingStore::store_step`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Token rows written into their block.
    pub rows_written: usize,
    /// Token rows dropped: their block generation is stale, freed, lost or was refused.
    pub rows_dropped: usize,
    /// Blocks of this step that could not be stored because every stored block was held; each
    /// is also reported by [`RoutingStore::take_lost`] with [`LossReason::Refused`].
    pub blocks_refused: usize,
}

/// A block generation whose rows the store no longer has (or never got), for the KV cache
/// manager: such a block must stop matching prefix lookups, and a request holding it must be
/// recomputed or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LostBlock {
    /// The block.
    pub block: BlockId,
    /// The generation whose rows are gone.
    pub generation: BlockGeneration,
    /// Why.
    pub reason: LossReason,
}
