//! The MoE router, the expert sort, the grouped expert products and the combine.

use super::{Weights, addr_or_null, bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};

/// The routing function (the model crate's `RouterKind`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterKind {
    /// Softmax over all experts, top-k, optionally renormalised (Qwen3-MoE, Mixtral).
    SoftmaxTopK {
        /// Divide the k weights by their sum.
        renormalize: bool,
    },
    /// Top-k of the logits, then softmax over the k (Granite).
    TopKSoftmax,
    /// Sigmoid scores, selection-only bias, group-limited top-k, optional renormalisation, times a
    /// scaling factor (Nemotron-H).
    SigmoidGrouped {
        /// Expert groups.
        num_groups: usize,
        /// Groups kept.
        topk_groups: usize,
        /// Divide the k weights by their sum (plus 1e-20).
        renormalize: bool,
        /// The routed scaling factor.
        scaling: f32,
    },
}

/// A router launch's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterParams {
    /// The routing function.
    pub kind: RouterKind,
    /// Routed experts.
    pub num_experts: usize,
    /// Experts per token, at most [`cfg::ROUTER_MAX_TOP_K`].
    pub top_k: usize,
}

/// The activation between a grouped product's up and down projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertActivation {
    /// `silu(x . gate) * (x . up)` (`MOE_ACT_SWIGLU`).
    SwiGlu = 0,
    /// `relu(x . up)^2` (`MOE_ACT_RELU2`).
    Relu2 = 1,
}

/// Which of a MoE layer's experts the grouped products run: `first .. first + num_local` of
/// `num_experts`, whose weights are stacked from `first` (every expert on a single rank; a
/// contiguous slice on each rank of an expert-parallel group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShard {
    /// Routed experts of the layer.
    pub num_experts: usize,
    /// This rank's first expert.
    pub first: usize,
    /// Experts this rank holds.
    pub num_local: usize,
}

impl ExpertShard {
    /// Every expert of the layer.
    pub fn all(num_experts: usize) -> Self {
        Self { num_experts, first: 0, num_local: num_experts }
    }

    /// The slice as the kernels' `(first_local, num_local)`, if it lies inside the layer.
    fn check(&self, id: KernelId) -> Result<(i32, i32), BackendError> {
        if self.first + self.num_local > self.num_experts {
            return Err(bad(id, "the local experts lie past the layer's experts"));
        }
        let first = i32::try_from(self.first).map_err(|_| bad(id, "first expert past an int"))?;
        Ok((first, int(id, "num_local", self.num_local)?))
    }
}

/// The outputs of the expert sort that the expert products and the combine read. The sorted
/// layout has a row per pair, experts ascending, each expert's pairs in pair order.
#[derive(Clone, Copy, Debug)]
pub struct MoeSortBuffers<'a> {
    /// The pair of each sorted row, `[num_pairs]`.
    pub sorted_pairs: DevSlice<'a, i32>,
    /// The sorted row of each pair, `[num_pairs]`.
    pub pair_rows: DevSlice<'a, i32>,
    /// The first sorted row of each expert, and the number of pairs last, `[num_experts + 1]`.
    pub expert_starts: DevSlice<'a, i32>,
}

impl CudaDevice {
    /// Routes `num_tokens` tokens from their router logits `[num_tokens, num_experts]`: expert ids
    /// in canonical order into `ids` (int32) and, when given, into this layer's plane of the
    /// routing buffer (int16), weights in the same order into `weights` (`moe_router_topk`).
    #[allow(clippy::too_many_arguments)] // the kernel's own buffers
    pub fn moe_router(
        &self,
        p: &RouterParams,
        logits: DevSlice<'_, f32>,
        bias: Option<DevSlice<'_, f32>>,
        ids: DevSlice<'_, i32>,
        weights: DevSlice<'_, f32>,
        routing: Option<DevSlice<'_, i16>>,
        num_tokens: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::MoeRouter;
        let (e, k) = (p.num_experts, p.top_k);
        if k == 0 || k > cfg::ROUTER_MAX_TOP_K || k > e {
            return Err(bad(id, format!("top_k {k} with {e} experts")));
        }
        fits(id, "logits", &logits, num_tokens * e)?;
        fits(id, "ids", &ids, num_tokens * k)?;
        fits(id, "weights", &weights, num_tokens * k)?;
        if let Some(b) = &bias {
            fits(id, "bias", b, e)?;
        }
        if let Some(r) = &routing {
            fits(id, "routing", r, num_tokens * k)?;
        }
        let (kind, renorm, groups, topk_groups, scaling) = match p.kind {
            RouterKind::SoftmaxTopK { renormalize } => (0i32, renormalize, 1, 1, 1.0f32),
            RouterKind::TopKSoftmax => (1, false, 1, 1, 1.0),
            RouterKind::SigmoidGrouped { num_groups, topk_groups, renormalize, scaling } => {
                let ok = num_groups > 0
                    && num_groups <= cfg::ROUTER_MAX_GROUPS
                    && e % num_groups == 0
                    && (1..=num_groups).contains(&topk_groups);
                if !ok {
                    return Err(bad(
                        id,
                        format!("{num_groups} groups, keep {topk_groups}, {e} experts"),
                    ));
                }
                (2, renormalize, num_groups, topk_groups, scaling)
            }
        };
        let sh = shape(id, cfg::router(num_tokens, e))?;
        let (logits, bias, ids, weights, routing) =
            (logits.addr(), addr_or_null(bias), ids.addr(), weights.addr(), addr_or_null(routing));
        let (n, e, k) = (int(id, "tokens", num_tokens)?, int(id, "experts", e)?, k as i32);
        let (renorm, groups, topk_groups) = (renorm as i32, groups as i32, topk_groups as i32);
        launch!(
            self,
            id,
            sh,
            [
                logits,
                bias,
                ids,
                weights,
                routing,
                n,
                e,
                k,
                kind,
                renorm,
                groups,
                topk_groups,
                scaling,
            ]
        )
    }

    /// Sorts the `num_pairs` (token, rank) pairs of `ids` by expert (`moe_sort_pairs`).
    pub fn moe_sort(
        &self,
        ids: DevSlice<'_, i32>,
        s: &MoeSortBuffers<'_>,
        num_pairs: usize,
        num_experts: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::MoeSortPairs;
        fits(id, "ids", &ids, num_pairs)?;
        fits(id, "sorted_pairs", &s.sorted_pairs, num_pairs)?;
        fits(id, "pair_rows", &s.pair_rows, num_pairs)?;
        fits(id, "expert_starts", &s.expert_starts, num_experts + 1)?;
        let sh = shape(id, cfg::moe_sort(num_experts))?;
        let (ids, sorted, pair_rows, starts) =
            (ids.addr(), s.sorted_pairs.addr(), s.pair_rows.addr(), s.expert_starts.addr());
        let (pairs, experts) = (int(id, "pairs", num_pairs)?, int(id, "experts", num_experts)?);
        launch!(self, id, sh, [ids, sorted, pair_rows, starts, pairs, experts])
    }

    /// The up (and gate) projections of every sorted row of this rank's experts with their
    /// weights `[num_local, inter, hidden]`, activated, into `act` `[num_pairs, inter]`
    /// (`moe_expert_up`; `moe_expert_up_f32w` for f32 weights, `moe_expert_up_mma` for bf16
    /// precision on tensor cores; `moe_expert_up_row[_f32w]` in a step of at most a pair per
    /// expert, [`cfg::moe_takes_row_kernels`]); the other ranks' rows are left as they are.
    /// `gate` is required for SwiGLU (in the storage of `up`) and ignored for relu^2.
    #[allow(clippy::too_many_arguments)] // the kernel's own buffers and sizes
    pub fn moe_expert_up(
        &self,
        x: DevSlice<'_, f32>,
        up: Weights<'_>,
        gate: Option<Weights<'_>>,
        s: &MoeSortBuffers<'_>,
        act: DevSlice<'_, f32>,
        activation: ExpertActivation,
        (num_tokens, top_k): (usize, usize),
        experts: ExpertShard,
        (hidden, inter): (usize, usize),
    ) -> Result<(), BackendError> {
        const UP: [KernelId; 3] =
            [KernelId::MoeExpertUp, KernelId::MoeExpertUpMma, KernelId::MoeExpertUpF32];
        let id = up.kernel(UP);
        let pairs = num_tokens * top_k;
        let (first, _) = experts.check(id)?;
        fits(id, "x", &x, num_tokens * hidden)?;
        up.fits(id, "up", experts.num_local * inter * hidden)?;
        let gate = match (activation, gate) {
            (ExpertActivation::SwiGlu, Some(g)) => {
                if g.kernel(UP) != id {
                    return Err(bad(id, "gate and up weights in different storage or arithmetic"));
                }
                g.fits(id, "gate", experts.num_local * inter * hidden)?;
                g.addr()
            }
            (ExpertActivation::SwiGlu, None) => return Err(bad(id, "SwiGLU needs gate weights")),
            (ExpertActivation::Relu2, _) => 0,
        };
        fits(id, "act", &act, pairs * inter)?;
        let (id, sh, last) = self.expert_launch(id, inter, pairs, experts, s)?;
        let (x, up, sorted, act) = (x.addr(), up.addr(), s.sorted_pairs.addr(), act.addr());
        let (top_k, hidden, inter) =
            (int(id, "top_k", top_k)?, int(id, "hidden", hidden)?, int(id, "inter", inter)?);
        let activation = activation as i32;
        let starts = s.expert_starts.addr();
        launch!(
            self,
            id,
            sh,
            [x, up, gate, sorted, starts, act, top_k, hidden, inter, activation, first, last]
        )
    }

    /// The down projections of every sorted row of this rank's experts with their weights
    /// `[num_local, hidden, inter]` into `out` `[num_pairs, hidden]` (`moe_expert_down`;
    /// `moe_expert_down_f32w` for f32 weights, `moe_expert_down_mma` for bf16 precision on tensor
    /// cores; `moe_expert_down_row[_f32w]` in a step of at most a pair per expert); the other
    /// ranks' rows are left as they are.
    pub fn moe_expert_down(
        &self,
        act: DevSlice<'_, f32>,
        down: Weights<'_>,
        s: &MoeSortBuffers<'_>,
        out: DevSlice<'_, f32>,
        (num_pairs, experts): (usize, ExpertShard),
        (hidden, inter): (usize, usize),
    ) -> Result<(), BackendError> {
        let id = down.kernel([
            KernelId::MoeExpertDown,
            KernelId::MoeExpertDownMma,
            KernelId::MoeExpertDownF32,
        ]);
        let (first, _) = experts.check(id)?;
        let rows = num_pairs;
        fits(id, "act", &act, rows * inter)?;
        down.fits(id, "down", experts.num_local * hidden * inter)?;
        fits(id, "out", &out, rows * hidden)?;
        let (id, sh, last) = self.expert_launch(id, hidden, rows, experts, s)?;
        // The activations are in sorted order already: no pair is looked up.
        let (act, down, starts, out) =
            (act.addr(), down.addr(), s.expert_starts.addr(), out.addr());
        let (hidden, inter) = (int(id, "hidden", hidden)?, int(id, "inter", inter)?);
        launch!(self, id, sh, [act, down, starts, out, hidden, inter, first, last])
    }

    /// The kernel that runs expert product `id` with `cols` outputs per row over `num_pairs`
    /// pairs, its grid, and the last argument it takes. In a step of at most a pair per expert
    /// the `f32`-arithmetic kernels give way to their row kernels (a block per sorted row,
    /// [`cfg::moe_expert_row`]), whose last argument is the rank's number of experts. Otherwise
    /// a block row per expert of the rank (the tensor-core kernels also need bf16 tensor cores)
    /// walks the rows the sort's expert starts give it, and the last argument is how many blocks
    /// share an expert's column tile ([`cfg::moe_row_splits`]).
    fn expert_launch(
        &self,
        id: KernelId,
        cols: usize,
        num_pairs: usize,
        experts: ExpertShard,
        s: &MoeSortBuffers<'_>,
    ) -> Result<(KernelId, cfg::Shape, i32), BackendError> {
        fits(id, "expert_starts", &s.expert_starts, experts.num_experts + 1)?;
        if let Some(row_id) = row_kernel(id, num_pairs, experts) {
            let sh = shape(row_id, cfg::moe_expert_row(cols, num_pairs))?;
            return Ok((row_id, sh, int(row_id, "num_local", experts.num_local)?));
        }
        let mma = matches!(id, KernelId::MoeExpertUpMma | KernelId::MoeExpertDownMma);
        let pass_rows = match id {
            _ if mma => cfg::EXPERT_MMA_ROWS,
            KernelId::MoeExpertUp | KernelId::MoeExpertUpF32 => cfg::EXPERT_UP_ROWS,
            _ => cfg::EXPERT_DOWN_ROWS,
        };
        let splits = cfg::moe_row_splits(num_pairs, experts.num_experts, pass_rows);
        let sh = match mma {
            true => {
                self.check_mma(id)?;
                cfg::moe_expert_mma(cols, experts.num_local, splits)
            }
            false => cfg::moe_expert(cols, experts.num_local, splits),
        };
        Ok((id, shape(id, sh)?, splits as i32))
    }

    /// Each token's output: its experts' rows weighted in rank order, plus the shared expert's
    /// output when given (`moe_combine`).
    #[allow(clippy::too_many_arguments)] // the kernel's own buffers and sizes
    pub fn moe_combine(
        &self,
        expert_out: DevSlice<'_, f32>,
        pair_rows: DevSlice<'_, i32>,
        weights: DevSlice<'_, f32>,
        shared: Option<DevSlice<'_, f32>>,
        out: DevSlice<'_, f32>,
        (num_tokens, top_k): (usize, usize),
        hidden: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::MoeCombine;
        fits(id, "pair_rows", &pair_rows, num_tokens * top_k)?;
        fits(id, "weights", &weights, num_tokens * top_k)?;
        fits(id, "out", &out, num_tokens * hidden)?;
        if let Some(s) = &shared {
            fits(id, "shared", s, num_tokens * hidden)?;
        }
        if !expert_out.len().is_multiple_of(hidden.max(1)) {
            return Err(bad(id, "expert_out is not whole rows"));
        }
        let sh = shape(id, cfg::per_token(hidden, num_tokens))?;
        let (eo, rows, w, sh_addr, out) =
            (expert_out.addr(), pair_rows.addr(), weights.addr(), addr_or_null(shared), out.addr());
        let (top_k, hidden) = (int(id, "top_k", top_k)?, int(id, "hidden", hidden)?);
        launch!(self, id, sh, [eo, rows, w, sh_addr, out, top_k, hidden])
    }

    /// Under expert parallelism over GPUs that read each other's memory: copies every other
    /// rank's run of the sorted expert rows from that rank's buffer (`peer_rows[q]`, the device
    /// address of rank q's `expert_out`, as [`crate::cuda::peer::PeerLink::buffers`] gives
    /// them) into this rank's `expert_out`, for a step of `num_pairs` (token, rank) pairs. Every
    /// rank holds `shard.num_local` experts, rank q those from `q * shard.num_local`. The caller
    /// orders the copy after the peers' expert kernels and their next writes after it
    /// ([`crate::cuda::peer`]).
    pub fn moe_gather_peer_rows(
        &self,
        expert_out: DevSlice<'_, f32>,
        peer_rows: DevSlice<'_, u64>,
        expert_starts: DevSlice<'_, i32>,
        (num_pairs, shard): (usize, ExpertShard),
        (rank, world_size): (usize, usize),
        hidden: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::MoeGatherPeerRows;
        if shard.num_local * world_size != shard.num_experts || rank >= world_size {
            return Err(bad(
                id,
                format!(
                    "rank {rank} of {world_size} holding {} of {} experts",
                    shard.num_local, shard.num_experts
                ),
            ));
        }
        let rows = num_pairs;
        fits(id, "expert_out", &expert_out, rows * hidden)?;
        fits(id, "peer_rows", &peer_rows, world_size)?;
        fits(id, "expert_starts", &expert_starts, shard.num_experts + 1)?;
        let sh = shape(id, cfg::per_row(rows))?;
        let (out, peers, starts) = (expert_out.addr(), peer_rows.addr(), expert_starts.addr());
        let num_local = int(id, "num_local", shard.num_local)?;
        let (world, hidden) = (int(id, "world_size", world_size)?, int(id, "hidden", hidden)?);
        let rank = rank as i32; // Below world_size, an int.
        launch!(self, id, sh, [out, peers, starts, num_local, rank, world, hidden])
    }
}

/// The row kernel that replaces the `f32`-arithmetic expert kernel `id` in a step of `num_pairs`
/// pairs, when the step is small enough ([`cfg::moe_takes_row_kernels`]); the tensor-core
/// kernels have none.
fn row_kernel(id: KernelId, num_pairs: usize, experts: ExpertShard) -> Option<KernelId> {
    if !cfg::moe_takes_row_kernels(num_pairs, experts.num_experts) {
        return None;
    }
    match id {
        KernelId::MoeExpertUp => Some(KernelId::MoeExpertUpRow),
        KernelId::MoeExpertUpF32 => Some(KernelId::MoeExpertUpRowF32),
        KernelId::MoeExpertDown => Some(KernelId::MoeExpertDownRow),
        KernelId::MoeExpertDownF32 => Some(KernelId::MoeExpertDownRowF32),
        _ => None,
    }
}
