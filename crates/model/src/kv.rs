//! The paged KV cache tensors: for every attention layer, keys and values for
//! `num_blocks * block_size` token slots. The slot of position `p` of a sequence is
//! `block_table[p / block_size] * block_size + p % block_size`, as in vLLM.

use routed_types::BlockRef;

/// Keys and values of one attention layer, `[num_slots, num_kv_heads, head_dim]` each.
pub(crate) struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The KV tensors of every attention layer.
pub struct KvCache {
    block_size: usize,
    num_blocks: usize,
    /// Floats per slot: `num_kv_heads * head_dim`.
    slot_width: usize,
    pub(crate) layers: Vec<LayerKv>,
}

impl KvCache {
    /// Allocates `num_blocks` blocks of `block_size` slots for `num_layers` attention layers.
    pub fn new(num_layers: usize, num_blocks: usize, block_size: usize, slot_width: usize) -> Self {
        let n = num_blocks * block_size * slot_width;
        let layers =
            (0..num_layers).map(|_| LayerKv { k: vec![0.0; n], v: vec![0.0; n] }).collect();
        Self { block_size, num_blocks, slot_width, layers }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Floats per token slot per layer (keys or values).
    pub fn slot_width(&self) -> usize {
        self.slot_width
    }

    /// Host bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers.len()
            * 2
            * self.num_blocks
            * self.block_size
            * self.slot_width
            * size_of::<f32>()
    }

    /// The slot of `position` for a sequence with `block_table`.
    #[inline]
    pub fn slot(&self, block_table: &[BlockRef], position: usize) -> usize {
        block_table[position / self.block_size].block.index() * self.block_size
            + position % self.block_size
    }
}
