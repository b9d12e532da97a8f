//! Which part of a checkpoint one rank of an expert-parallel group holds.

use std::ops::Range;

/// The slice of every MoE layer's routed experts a rank holds: with `num_ranks` ranks, rank `r`
/// holds experts `[r * E / num_ranks, (r + 1) * E / num_ranks)`. Everything else (embeddings,
/// attention, Mamba mixers, norms, routers, shared experts, the LM head) is replicated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShard {
    /// This rank, `0..num_ranks`.
    pub rank: usize,
    /// Ranks in the expert-parallel group.
    pub num_ranks: usize,
}

impl ExpertShard {
    /// One rank holding every expert.
    pub const WHOLE: Self = Self { rank: 0, num_ranks: 1 };

    /// The experts this rank holds out of `num_experts`, which `num_ranks` must divide.
    pub fn experts(self, num_experts: usize) -> Range<usize> {
        let per_rank = num_experts / self.num_ranks.max(1);
        self.rank * per_rank..(self.rank + 1) * per_rank
    }

    /// Rank `r`'s experts out of `num_experts`.
    pub fn experts_of(self, r: usize, num_experts: usize) -> Range<usize> {
        Self { rank: r, ..self }.experts(num_experts)
    }
}

/// What loading read from the checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Tensors read (a slice of a fused tensor counts as one).
    pub num_tensors: usize,
    /// Bytes read from the checkpoint's mapping.
    pub num_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_split_the_experts_into_contiguous_equal_slices() {
        let shard = ExpertShard { rank: 0, num_ranks: 4 };
        let slices: Vec<_> = (0..4).map(|r| shard.experts_of(r, 8)).collect();
        assert_eq!(slices, [0..2, 2..4, 4..6, 6..8]);
        assert_eq!(ExpertShard::WHOLE.experts(8), 0..8);
    }
}
