//! The step's heads into the paged KV cache, attention over it, and state slot copies.

use super::{bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};
use half::bf16;

/// The shape of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; `num_heads` is a multiple of it.
    pub num_kv_heads: usize,
    /// Width of a head, at most [`cfg::ATTN_MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Entries per row of the block tables.
    pub max_blocks_per_seq: usize,
    /// A query sees at most this many most recent keys (itself included); `None`: all.
    pub sliding_window: Option<usize>,
    /// Multiplier of `q . k`.
    pub scale: f32,
    /// Tiles per partition ([`cfg::ATTN_PARTITION_TILES`] in the engine): a row's online
    /// softmax restarts at every partition and the partitions are folded in order.
    pub partition_tiles: usize,
}

/// The shape of the heads that [`CudaDevice::qkv_heads`] takes from a fused q/k/v projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvHeadsParams {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Leading dims of a head that are rotated (even, at most `head_dim`); ignored without a
    /// rotary table.
    pub rot_dim: usize,
    /// The per-head norms' epsilon.
    pub eps: f32,
}

/// The buffers of one [`CudaDevice::qkv_heads`] launch.
#[derive(Clone, Copy, Debug)]
pub struct QkvHeadsBuffers<'a> {
    /// The fused projection, `[num_tokens, num_heads + 2 * num_kv_heads, head_dim]`: queries,
    /// then keys, then values.
    pub qkv: DevSlice<'a, f32>,
    /// The queries' per-head norm weight, `[head_dim]`.
    pub q_norm: Option<DevSlice<'a, f32>>,
    /// The keys' per-head norm weight, `[head_dim]`.
    pub k_norm: Option<DevSlice<'a, f32>>,
    /// The rotary table ([`crate::cuda::host::rope_table`]); `None`: no rotary embedding.
    pub cos_sin: Option<DevSlice<'a, f32>>,
    /// `[num_tokens]`, inside the rotary table.
    pub positions: DevSlice<'a, i32>,
    /// Each token's cache slot, `[num_tokens]`.
    pub slots: DevSlice<'a, i32>,
    /// The normed, rotated queries, `[num_tokens, num_heads, head_dim]`.
    pub q: DevSlice<'a, f32>,
    /// This layer's keys, `[num_slots, num_kv_heads, head_dim]`.
    pub k_cache: DevSlice<'a, bf16>,
    /// This layer's values, same layout.
    pub v_cache: DevSlice<'a, bf16>,
}

/// Where split attention writes each partition's results before they are folded.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSplit<'a> {
    /// `[num_tokens, num_heads, num_parts, 2 + head_dim]`.
    pub partials: DevSlice<'a, f32>,
    /// Partitions per row in `partials`; positions must stay below `num_parts` partitions.
    pub num_parts: usize,
}

impl AttentionSplit<'_> {
    /// Floats of `partials` for `num_tokens` rows of `num_heads` heads.
    pub fn partials_len(
        num_tokens: usize,
        num_heads: usize,
        head_dim: usize,
        parts: usize,
    ) -> usize {
        num_tokens * num_heads * parts * (2 + head_dim)
    }
}

/// The buffers of one attention launch.
#[derive(Clone, Copy, Debug)]
pub struct AttentionBuffers<'a> {
    /// Queries after RoPE, `[num_tokens, num_heads, head_dim]`.
    pub q: DevSlice<'a, f32>,
    /// This layer's keys, `[num_slots, num_kv_heads, head_dim]`.
    pub k_cache: DevSlice<'a, bf16>,
    /// This layer's values, same layout.
    pub v_cache: DevSlice<'a, bf16>,
    /// `[num_seqs, max_blocks_per_seq]`.
    pub block_tables: DevSlice<'a, i32>,
    /// `[num_tokens]`.
    pub positions: DevSlice<'a, i32>,
    /// Token offset of each sequence, `[num_seqs + 1]`.
    pub seq_starts: DevSlice<'a, i32>,
    /// Work items from [`cfg::attention_items`], `[num_items, 2]`.
    pub items: DevSlice<'a, i32>,
    /// `[num_tokens, num_heads, head_dim]`.
    pub out: DevSlice<'a, f32>,
}

impl CudaDevice {
    /// The heads of `num_tokens` tokens from the fused q/k/v projection (`qkv_heads_f32`): each
    /// query head normed by `q_norm` (when given) and rotated into `q`; each key head normed by
    /// `k_norm` and rotated, and each value head, written to the token's slot of one layer's
    /// cache, rounded to bf16. A negative slot writes no key or value. The CPU layer's bits.
    pub fn qkv_heads(
        &self,
        p: &QkvHeadsParams,
        b: &QkvHeadsBuffers<'_>,
        num_tokens: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::QkvHeads;
        let (hd, nq, nkv) = (p.head_dim, p.num_heads, p.num_kv_heads);
        let rotary = b.cos_sin.is_some();
        if hd == 0 || (rotary && (p.rot_dim == 0 || p.rot_dim > hd || !p.rot_dim.is_multiple_of(2)))
        {
            return Err(bad(id, format!("rot_dim {} with head_dim {hd}", p.rot_dim)));
        }
        fits(id, "qkv", &b.qkv, num_tokens * (nq + 2 * nkv) * hd)?;
        fits(id, "q", &b.q, num_tokens * nq * hd)?;
        fits(id, "positions", &b.positions, num_tokens)?;
        fits(id, "slots", &b.slots, num_tokens)?;
        for (what, norm) in [("q_norm", &b.q_norm), ("k_norm", &b.k_norm)] {
            if let Some(w) = norm {
                fits(id, what, w, hd)?;
            }
        }
        if let Some(table) = &b.cos_sin {
            fits(id, "cos_sin", table, p.rot_dim)?;
        }
        let slot_width = nkv * hd;
        if b.k_cache.len() != b.v_cache.len() || !b.k_cache.len().is_multiple_of(slot_width) {
            return Err(bad(id, "the key and value caches must be whole slots of the same size"));
        }
        let sh = shape(id, cfg::qkv_heads(num_tokens, nq + 2 * nkv, hd))?;
        let addr = |s: &Option<DevSlice<'_, f32>>| s.as_ref().map_or(0, |s| s.addr());
        let (qkv, q_norm, k_norm, cos_sin) =
            (b.qkv.addr(), addr(&b.q_norm), addr(&b.k_norm), addr(&b.cos_sin));
        let (positions, slots, q) = (b.positions.addr(), b.slots.addr(), b.q.addr());
        let (kc, vc) = (b.k_cache.addr(), b.v_cache.addr());
        let (nq, nkv) = (int(id, "num_heads", nq)?, int(id, "num_kv_heads", nkv)?);
        let (hd, rot) = (int(id, "head_dim", hd)?, int(id, "rot_dim", p.rot_dim)?);
        let eps = p.eps;
        launch!(
            self,
            id,
            sh,
            [qkv, q_norm, k_norm, cos_sin, positions, slots, q, kc, vc, nq, nkv, hd, rot, eps]
        )
    }

    /// Attention of the step's queries over the paged cache (`paged_attention_bf16kv`). The
    /// step's keys and values must already be written ([`CudaDevice::qkv_heads`]). With `split`,
    /// each CTA takes one partition of its rows' keys and `attention_combine_f32` folds them:
    /// the same bits as without, from more CTAs (for decode of a few sequences over long
    /// contexts).
    pub fn paged_attention(
        &self,
        p: &AttentionParams,
        b: &AttentionBuffers<'_>,
        (num_tokens, num_seqs, num_items): (usize, usize, usize),
        split: Option<AttentionSplit<'_>>,
    ) -> Result<(), BackendError> {
        let id = KernelId::PagedAttention;
        if p.partition_tiles == 0 {
            return Err(bad(id, "partitions of no tile"));
        }
        if p.num_kv_heads == 0 || !p.num_heads.is_multiple_of(p.num_kv_heads) {
            return Err(bad(id, "num_heads must be a multiple of num_kv_heads"));
        }
        if p.head_dim > cfg::ATTN_MAX_HEAD_DIM {
            return Err(bad(
                id,
                format!("head_dim {} over {}", p.head_dim, cfg::ATTN_MAX_HEAD_DIM),
            ));
        }
        fits(id, "q", &b.q, num_tokens * p.num_heads * p.head_dim)?;
        fits(id, "out", &b.out, num_tokens * p.num_heads * p.head_dim)?;
        fits(id, "positions", &b.positions, num_tokens)?;
        fits(id, "seq_starts", &b.seq_starts, num_seqs + 1)?;
        fits(id, "block_tables", &b.block_tables, num_seqs * p.max_blocks_per_seq)?;
        fits(id, "items", &b.items, 2 * num_items)?;
        let slot_width = p.num_kv_heads * p.head_dim;
        if b.k_cache.len() != b.v_cache.len()
            || !b.k_cache.len().is_multiple_of(slot_width * p.block_size)
        {
            return Err(bad(id, "the caches must be whole blocks of the same size"));
        }
        let num_parts = split.map_or(1, |s| s.num_parts);
        if let Some(s) = split {
            let need = AttentionSplit::partials_len(num_tokens, p.num_heads, p.head_dim, num_parts);
            fits(id, "partials", &s.partials, need)?;
        }
        let sh = shape(id, cfg::attention(num_items, p.num_kv_heads, p.head_dim, num_parts))?;
        let partials = split.map_or(0, |s| s.partials.addr());
        let (max_parts, part_tiles) =
            (int(id, "num_parts", num_parts)?, int(id, "partition_tiles", p.partition_tiles)?);
        let (q, kc, vc, tables, pos, starts, items, out) = (
            b.q.addr(),
            b.k_cache.addr(),
            b.v_cache.addr(),
            b.block_tables.addr(),
            b.positions.addr(),
            b.seq_starts.addr(),
            b.items.addr(),
            b.out.addr(),
        );
        let heads = int(id, "num_heads", p.num_heads)?;
        let kv_heads = int(id, "num_kv_heads", p.num_kv_heads)?;
        let head_dim = int(id, "head_dim", p.head_dim)?;
        let block_size = int(id, "block_size", p.block_size)?;
        let max_blocks = int(id, "max_blocks_per_seq", p.max_blocks_per_seq)?;
        let window = match p.sliding_window {
            Some(w) => int(id, "sliding_window", w)?,
            None => 0,
        };
        let scale = p.scale;
        launch!(
            self,
            id,
            sh,
            [
                q, kc, vc, tables, pos, starts, items, out, partials, max_parts, part_tiles, heads,
                kv_heads, head_dim, block_size, max_blocks, window, scale,
            ]
        )?;
        if split.is_none() {
            return Ok(());
        }
        let id = KernelId::AttentionCombine;
        let sh = shape(id, cfg::attention_combine(num_tokens, p.num_heads, p.head_dim))?;
        launch!(self, id, sh, [partials, pos, out, heads, head_dim, max_parts, part_tiles, window])
    }

    /// Copies whole state slots: for each of `num_pairs` pairs `(src, dst)`, slot `dst` of `dst`
    /// becomes slot `src` of `src`, or zeros for a negative `src` (`state_copy_f32`). Restoring a
    /// snapshot and taking one are the same call with the pools swapped.
    pub fn state_copy(
        &self,
        src: DevSlice<'_, f32>,
        dst: DevSlice<'_, f32>,
        pairs: DevSlice<'_, i32>,
        num_pairs: usize,
        slot_len: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::StateCopy;
        fits(id, "pairs", &pairs, 2 * num_pairs)?;
        if !src.len().is_multiple_of(slot_len.max(1)) || !dst.len().is_multiple_of(slot_len.max(1))
        {
            return Err(bad(id, "the pools must be whole slots"));
        }
        let blocks = slot_len.div_ceil(cfg::ELEMENTWISE_THREADS).min(1024);
        let sh = shape(id, cfg::per_token(blocks * cfg::ELEMENTWISE_THREADS, num_pairs))?;
        let (src, dst, pairs) = (src.addr(), dst.addr(), pairs.addr());
        let slot_len = int(id, "slot_len", slot_len)?;
        launch!(self, id, sh, [src, dst, pairs, slot_len])
    }
}
