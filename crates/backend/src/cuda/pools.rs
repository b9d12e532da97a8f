//! The typed layouts of the pools a GPU runner allocates once: the paged KV cache, the Mamba state
//! slots (live and snapshot) and the routing buffer. Each is a set of spans of one [`ArenaLayout`]
//! plus the index arithmetic over them, all host-side and unit-tested; the kernels receive the
//! resolved addresses. The step inputs are one packed buffer ([`crate::step_inputs`]).

use super::arena::{ArenaLayout, Span};
use half::bf16;

/// The paged KV cache of every attention layer: keys and values of `num_blocks * block_size`
/// token slots, `[slot, kv_head, head_dim]` bf16 per layer.
#[derive(Clone, Debug)]
pub struct KvPool {
    /// Keys per attention layer.
    pub k: Vec<Span<bf16>>,
    /// Values per attention layer.
    pub v: Vec<Span<bf16>>,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// `num_kv_heads * head_dim`: elements per token slot.
    pub slot_width: usize,
}

impl KvPool {
    /// Reserves the cache in `layout`.
    pub fn reserve(
        layout: &mut ArenaLayout,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        slot_width: usize,
    ) -> Self {
        let per_layer = num_blocks * block_size * slot_width;
        let k = (0..num_layers).map(|_| layout.push(per_layer)).collect();
        let v = (0..num_layers).map(|_| layout.push(per_layer)).collect();
        Self { k, v, block_size, num_blocks, slot_width }
    }

    /// The slot of `position` for a sequence with `block_table`, as the CPU cache numbers them:
    /// `block_table[p / block_size] * block_size + p % block_size`.
    pub fn slot(&self, block_table: &[u32], position: usize) -> Option<usize> {
        let block = *block_table.get(position / self.block_size)? as usize;
        (block < self.num_blocks).then(|| block * self.block_size + position % self.block_size)
    }
}

/// Live and snapshot slots of the Mamba state, the CPU `StateCache` layout: a slot holds, for each
/// Mamba layer, its conv state `[conv_kernel - 1, conv_dim]` then its SSM state
/// `[heads, state_size, head_dim]`.
#[derive(Clone, Debug)]
pub struct StatePool {
    /// `[num_live + 1, slot_len]` f32; the last slot is scratch for padded rows.
    pub live: Span<f32>,
    /// `[num_snapshots, slot_len]` f32.
    pub snapshots: Span<f32>,
    /// Floats of conv state per layer.
    pub conv_len: usize,
    /// Floats of SSM state per layer.
    pub ssm_len: usize,
    /// Mamba layers.
    pub num_layers: usize,
    /// Live slots available to sequences.
    pub num_live: usize,
}

impl StatePool {
    /// Reserves `num_live` live slots (plus the scratch slot) and `num_snapshots` snapshot slots.
    pub fn reserve(
        layout: &mut ArenaLayout,
        num_layers: usize,
        conv_len: usize,
        ssm_len: usize,
        num_live: usize,
        num_snapshots: usize,
    ) -> Self {
        let slot_len = num_layers * (conv_len + ssm_len);
        let live = layout.push((num_live + 1) * slot_len);
        let snapshots = layout.push(num_snapshots * slot_len);
        Self { live, snapshots, conv_len, ssm_len, num_layers, num_live }
    }

    /// Floats per slot.
    pub fn slot_len(&self) -> usize {
        self.num_layers * (self.conv_len + self.ssm_len)
    }

    /// The scratch live slot.
    pub fn scratch_slot(&self) -> usize {
        self.num_live
    }

    /// Offset of Mamba layer `layer`'s conv state within a slot.
    pub fn conv_offset(&self, layer: usize) -> usize {
        layer * (self.conv_len + self.ssm_len)
    }

    /// Offset of Mamba layer `layer`'s SSM state within a slot.
    pub fn ssm_offset(&self, layer: usize) -> usize {
        self.conv_offset(layer) + self.conv_len
    }
}

/// The routing buffer `(L, N, K)` int16 at a fixed device address: MoE layer `l`'s expert ids for
/// up to `max_tokens` tokens of a step. The router writes plane `l`; the host copies the first `n`
/// rows of every plane after the step.
#[derive(Clone, Debug)]
pub struct RoutingBuffer {
    /// All planes, `num_layers * max_tokens * top_k` ids.
    pub ids: Span<i16>,
    /// MoE layers.
    pub num_layers: usize,
    /// Rows per plane.
    pub max_tokens: usize,
    /// Experts per token.
    pub top_k: usize,
}

impl RoutingBuffer {
    /// Reserves the buffer.
    pub fn reserve(
        layout: &mut ArenaLayout,
        num_layers: usize,
        max_tokens: usize,
        top_k: usize,
    ) -> Self {
        Self { ids: layout.push(num_layers * max_tokens * top_k), num_layers, max_tokens, top_k }
    }

    /// Plane `layer`, `[max_tokens, top_k]`.
    pub fn plane(&self, layer: usize) -> Option<Span<i16>> {
        let len = self.max_tokens * self.top_k;
        if layer >= self.num_layers {
            return None;
        }
        self.ids.sub(layer * len, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_slots_follow_the_block_table() {
        let mut layout = ArenaLayout::new("kv");
        let kv = KvPool::reserve(&mut layout, 2, 10, 16, 4 * 64);
        assert_eq!(kv.k.len(), 2);
        assert_eq!(kv.k[0].len(), 10 * 16 * 256);
        assert!(kv.k[1].offset() > kv.k[0].offset() && kv.v[0].offset() > kv.k[1].offset());
        assert_eq!(kv.slot(&[7, 3], 0), Some(7 * 16));
        assert_eq!(kv.slot(&[7, 3], 17), Some(3 * 16 + 1));
        assert_eq!(kv.slot(&[7, 3], 32), None, "past the table");
        assert_eq!(kv.slot(&[10], 0), None, "block outside the pool");
    }

    #[test]
    fn state_offsets_match_the_cpu_slot_layout() {
        let mut layout = ArenaLayout::new("state");
        let pool = StatePool::reserve(&mut layout, 3, 30, 500, 4, 6);
        assert_eq!(pool.slot_len(), 3 * 530);
        assert_eq!(pool.live.len(), 5 * 3 * 530);
        assert_eq!(pool.snapshots.len(), 6 * 3 * 530);
        assert_eq!((pool.conv_offset(0), pool.ssm_offset(0)), (0, 30));
        assert_eq!((pool.conv_offset(2), pool.ssm_offset(2)), (1060, 1090));
        assert_eq!(pool.scratch_slot(), 4);
    }

    #[test]
    fn routing_planes_tile_the_buffer() {
        let mut layout = ArenaLayout::new("routing");
        let r = RoutingBuffer::reserve(&mut layout, 3, 64, 8);
        assert_eq!(r.ids.len(), 3 * 64 * 8);
        let planes: Vec<_> = (0..3).map(|l| r.plane(l).unwrap()).collect();
        assert_eq!(planes[0].offset(), r.ids.offset());
        assert_eq!(planes[2].offset(), r.ids.offset() + 2 * 64 * 8 * 2);
        assert!(planes.iter().all(|p| p.len() == 512));
        assert!(r.plane(3).is_none());
    }
}
