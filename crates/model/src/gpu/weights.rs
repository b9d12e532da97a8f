//! The model's weights on the device: one arena, laid out from the host model and filled once.
//!
//! Matrices keep their storage type (bf16 as the checkpoint stores them; f32 where the host model
//! holds f32), vectors (norms, biases, the Mamba parameters) are f32 as on the CPU. A layer's
//! experts are stacked into one `[num_local, rows, cols]` tensor per projection, the layout the
//! grouped expert kernels read: every expert on a single rank, the rank's slice under expert
//! parallelism (the host model of a rank holds only its slice).

use crate::{
    config::{AttentionConfig, FfnActivation, MambaConfig},
    error::{ModelError, Result},
    layers::{attention::Attention, mamba::Mamba, mlp::Mlp, moe::Moe},
    model::{Ffn, Mixer, Model},
};
use half::bf16;
use routed_backend::{
    cpu::{MatmulPrecision, Matrix, MatrixData},
    cuda::{
        ArenaLayout, CudaDevice, DevSlice, DeviceArena, DeviceElem, Span,
        ops::{ExpertShard, RouterKind, Weights},
    },
};

/// A weight matrix `[rows, cols]` on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GpuMatrix {
    pub data: GpuMatrixData,
    pub rows: usize,
    pub cols: usize,
}

/// A matrix's storage on the device, and the arithmetic of its products.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum GpuMatrixData {
    /// bf16, products in `f32` (the CPU's bits).
    Bf16(Span<bf16>),
    /// bf16, products in bf16 precision on tensor cores (`--matmul-precision bf16`).
    Bf16Mma(Span<bf16>),
    F32(Span<f32>),
}

impl GpuMatrixData {
    /// bf16 values in the arithmetic `precision` asks for.
    fn bf16(span: Span<bf16>, precision: MatmulPrecision) -> Self {
        match precision {
            MatmulPrecision::F32 => Self::Bf16(span),
            MatmulPrecision::Bf16 => Self::Bf16Mma(span),
        }
    }
}

#[derive(PartialEq)]
pub(crate) struct GpuAttention {
    pub cfg: AttentionConfig,
    pub kv_index: usize,
    /// The query, key and value projections stacked `[q rows + 2 * kv rows, hidden]`: one product
    /// gives every head of a token, each output with the bits of its own projection's.
    pub qkv: GpuMatrix,
    pub o: GpuMatrix,
    pub q_norm: Option<Span<f32>>,
    pub k_norm: Option<Span<f32>>,
    pub eps: f32,
}

#[derive(PartialEq)]
pub(crate) struct GpuMamba {
    pub cfg: MambaConfig,
    /// Index among the Mamba layers: its place in a state slot.
    pub index: usize,
    pub in_proj: GpuMatrix,
    pub conv_weight_t: Span<f32>,
    pub conv_bias: Option<Span<f32>>,
    pub dt_bias: Span<f32>,
    pub a: Span<f32>,
    pub d: Span<f32>,
    pub norm: Span<f32>,
    pub out_proj: GpuMatrix,
}

#[derive(PartialEq)]
pub(crate) struct GpuMlp {
    pub activation: FfnActivation,
    pub gate: Option<GpuMatrix>,
    pub up: GpuMatrix,
    pub down: GpuMatrix,
    pub inter: usize,
}

#[derive(PartialEq)]
pub(crate) struct GpuMoe {
    pub kind: RouterKind,
    /// Index among the MoE layers: its plane of the routing buffer.
    pub index: usize,
    pub top_k: usize,
    pub inter: usize,
    pub activation: FfnActivation,
    pub router: GpuMatrix,
    pub router_bias: Option<Span<f32>>,
    /// The experts this rank holds (all of them on a single rank).
    pub shard: ExpertShard,
    /// `[num_local, inter, hidden]` each; `gate` only for SwiGLU.
    pub up: GpuMatrixData,
    pub gate: Option<GpuMatrixData>,
    /// `[num_local, hidden, inter]`.
    pub down: GpuMatrixData,
    pub shared: Option<GpuMlp>,
}

/// One pre-normed block of a decoder layer: a token mixer or a feed-forward block.
#[derive(PartialEq)]
pub(crate) enum GpuBlock {
    Attention(GpuAttention),
    Mamba(GpuMamba),
    Dense(GpuMlp),
    Moe(GpuMoe),
}

/// Every weight of the model, in the order the forward runs them.
pub(crate) struct GpuWeights {
    pub arena: DeviceArena,
    /// `[vocab, hidden]`, in the checkpoint's storage.
    pub embed: GpuMatrixData,
    pub lm_head: GpuMatrix,
    pub final_norm: Span<f32>,
    /// Each block with its norm's weight, layer by layer, mixer before feed-forward.
    pub blocks: Vec<(Span<f32>, GpuBlock)>,
}

/// Copies a host tensor into its span once the arena exists.
type Fill<'m> = Box<dyn FnOnce(&mut DeviceArena) -> std::result::Result<(), String> + 'm>;

/// Spans reserved for the host model's tensors, and how to fill them.
struct Plan<'m> {
    layout: ArenaLayout,
    fills: Vec<Fill<'m>>,
}

impl<'m> Plan<'m> {
    fn vector(&mut self, data: &'m [f32]) -> Span<f32> {
        let span = self.layout.push::<f32>(data.len());
        self.fills.push(Box::new(move |a| a.upload(span, data).map_err(|e| e.to_string())));
        span
    }

    fn matrix(&mut self, m: &'m Matrix) -> GpuMatrix {
        let data = match m.data() {
            MatrixData::Bf16(v) => {
                let span = self.layout.push::<bf16>(v.len());
                self.fills.push(Box::new(move |a| a.upload(span, v).map_err(|e| e.to_string())));
                GpuMatrixData::bf16(span, m.precision())
            }
            MatrixData::F32(v) => GpuMatrixData::F32(self.vector(v)),
        };
        GpuMatrix { data, rows: m.rows(), cols: m.cols() }
    }

    /// Matrices of one width stacked row-wise into one `[sum of rows, cols]`, in their storage
    /// (bf16, or f32 for an f32 or f16 checkpoint) and arithmetic, which must be one for all: the
    /// same projection of every expert (`[experts, rows, cols]`, the grouped kernels' layout), or
    /// an attention's q, k and v, whose one product gives each part's outputs side by side, bit
    /// for bit each part's own (every output's sum runs over its weight row alone). `what` names
    /// the parts in a refusal.
    fn stacked(&mut self, what: &str, parts: &[&'m Matrix]) -> Result<GpuMatrix> {
        let first = parts.first();
        let cols = first.map_or(0, |m| m.cols());
        let rows = parts.iter().map(|m| m.rows()).sum();
        let bf16 = first.is_none_or(|m| matches!(m.data(), MatrixData::Bf16(_)));
        let precision = first.map_or(MatmulPrecision::F32, |m| m.precision());
        let data = match bf16 {
            true => GpuMatrixData::bf16(self.layout.push::<bf16>(rows * cols), precision),
            false => GpuMatrixData::F32(self.layout.push::<f32>(rows * cols)),
        };
        let mut at = 0;
        for m in parts {
            let len = m.rows() * cols;
            let fill: Fill<'m> = match (data, m.data()) {
                (GpuMatrixData::Bf16(span) | GpuMatrixData::Bf16Mma(span), MatrixData::Bf16(v))
                    if m.precision() == precision && m.cols() == cols =>
                {
                    let part = span.sub(at, len).expect("laid out for every part");
                    Box::new(move |a| a.upload(part, v).map_err(|e| e.to_string()))
                }
                (GpuMatrixData::F32(span), MatrixData::F32(v)) if m.cols() == cols => {
                    let part = span.sub(at, len).expect("laid out for every part");
                    Box::new(move |a| a.upload(part, v).map_err(|e| e.to_string()))
                }
                _ => {
                    return Err(unsupported(format!(
                        "{what} of more than one width, storage or precision (they are stacked \
                         in one matrix)"
                    )));
                }
            };
            self.fills.push(fill);
            at += len;
        }
        Ok(GpuMatrix { data, rows, cols })
    }
}

fn unsupported(message: String) -> ModelError {
    ModelError::Unsupported { path: "the CUDA device".into(), message }
}

/// The host model's tensors laid out one after another, with the fills that copy them.
struct Laid<'m> {
    plan: Plan<'m>,
    embed: GpuMatrixData,
    lm_head: GpuMatrix,
    final_norm: Span<f32>,
    blocks: Vec<(Span<f32>, GpuBlock)>,
}

impl<'m> Laid<'m> {
    /// Lays out `model`'s tensors in `layout`, in the order the forward runs them.
    fn out(model: &'m Model, layout: ArenaLayout) -> Result<Self> {
        let mut plan = Plan { layout, fills: Vec::new() };
        let table = plan.matrix(&model.embed);
        let embed = table.data;
        // Tied embeddings: the LM head reads the table.
        let lm_head = model.lm_head.as_ref().map_or(table, |m| plan.matrix(m));
        let final_norm = plan.vector(&model.final_norm);
        let mut blocks = Vec::new();
        let mut moe_index = 0;
        for layer in &model.layers {
            if let Some((norm, mixer)) = &layer.mixer {
                let block = match mixer {
                    Mixer::Attention(a) => GpuBlock::Attention(attention(&mut plan, a)?),
                    Mixer::Mamba(m) => GpuBlock::Mamba(mamba(&mut plan, m)),
                };
                blocks.push((plan.vector(norm), block));
            }
            if let Some((norm, ffn)) = &layer.ffn {
                let block = match ffn {
                    Ffn::Dense(m) => GpuBlock::Dense(mlp(&mut plan, m)),
                    Ffn::Moe(m) => {
                        moe_index += 1;
                        GpuBlock::Moe(moe(&mut plan, m, moe_index - 1)?)
                    }
                };
                blocks.push((plan.vector(norm), block));
            }
        }
        Ok(Self { plan, embed, lm_head, final_norm, blocks })
    }

    /// Runs the fills: every tensor copied into its span of `arena`.
    fn fill(self, arena: &mut DeviceArena) -> Result<()> {
        for fill in self.plan.fills {
            fill(arena).map_err(|e| unsupported(format!("uploading the weights: {e}")))?;
        }
        Ok(())
    }
}

impl GpuWeights {
    /// Uploads `model` (a whole model, or one rank's part of it) to `dev`.
    pub fn upload(model: &Model, dev: &CudaDevice) -> Result<Self> {
        let mut laid = Laid::out(model, ArenaLayout::new("weights"))?;
        let mut arena = DeviceArena::new(dev, &laid.plan.layout)?;
        let (embed, lm_head, final_norm) = (laid.embed, laid.lm_head, laid.final_norm);
        let blocks = std::mem::take(&mut laid.blocks);
        laid.fill(&mut arena)?;
        Ok(Self { arena, embed, lm_head, final_norm, blocks })
    }

    /// `model` laid out over this arena, refused unless every tensor lands exactly where the
    /// uploaded one is (same shapes, storage, arithmetic, order).
    fn relaid<'m>(&self, model: &'m Model) -> Result<Laid<'m>> {
        let laid = Laid::out(model, self.arena.relayout())?;
        let same = laid.plan.layout.num_bytes() <= self.arena.num_bytes()
            && (laid.embed, laid.lm_head, laid.final_norm)
                == (self.embed, self.lm_head, self.final_norm)
            && laid.blocks == self.blocks;
        if !same {
            return Err(unsupported(
                "the new weights differ in shape, storage or precision from the ones on the \
                 device"
                    .into(),
            ));
        }
        Ok(laid)
    }

    /// Whether `model`'s weights can replace these in place ([`GpuWeights::refill`]): nothing is
    /// written.
    pub fn check_refill(&self, model: &Model) -> Result<()> {
        self.relaid(model).map(drop)
    }

    /// Writes `model`'s weights over these, in place: the spans, and so every address a launch
    /// or a captured graph holds, stay. Refused before anything is written unless every tensor
    /// has the shape, storage and arithmetic of the one it replaces.
    pub fn refill(&mut self, model: &Model) -> Result<()> {
        let laid = self.relaid(model)?;
        laid.fill(&mut self.arena)
    }

    /// A span of the weights, for a launch.
    pub fn get<T: DeviceElem>(&self, span: Span<T>) -> Result<DevSlice<'_, T>> {
        Ok(self.arena.get(span)?)
    }

    /// A matrix's values, for the kernels that take any storage and arithmetic.
    pub fn values(&self, data: GpuMatrixData) -> Result<Weights<'_>> {
        Ok(match data {
            GpuMatrixData::Bf16(s) => Weights::Bf16(self.get(s)?),
            GpuMatrixData::Bf16Mma(s) => Weights::Bf16Mma(self.get(s)?),
            GpuMatrixData::F32(s) => Weights::F32(self.get(s)?),
        })
    }
}

fn attention<'m>(plan: &mut Plan<'m>, a: &'m Attention) -> Result<GpuAttention> {
    Ok(GpuAttention {
        cfg: a.cfg.clone(),
        kv_index: a.kv_index,
        qkv: plan.stacked(
            "the attention's q, k and v projections",
            &[&a.q_proj, &a.k_proj, &a.v_proj],
        )?,
        o: plan.matrix(&a.o_proj),
        q_norm: a.q_norm.as_deref().map(|w| plan.vector(w)),
        k_norm: a.k_norm.as_deref().map(|w| plan.vector(w)),
        eps: a.norm_eps,
    })
}

fn mamba<'m>(plan: &mut Plan<'m>, m: &'m Mamba) -> GpuMamba {
    GpuMamba {
        cfg: m.cfg.clone(),
        index: m.index,
        in_proj: plan.matrix(&m.in_proj),
        conv_weight_t: plan.vector(&m.conv_weight_t),
        conv_bias: m.conv_bias.as_deref().map(|b| plan.vector(b)),
        dt_bias: plan.vector(&m.dt_bias),
        a: plan.vector(&m.a),
        d: plan.vector(&m.d),
        norm: plan.vector(&m.norm),
        out_proj: plan.matrix(&m.out_proj),
    }
}

fn mlp<'m>(plan: &mut Plan<'m>, m: &'m Mlp) -> GpuMlp {
    GpuMlp {
        activation: m.activation,
        gate: m.gate.as_ref().map(|g| plan.matrix(g)),
        up: plan.matrix(&m.up),
        down: plan.matrix(&m.down),
        inter: m.inter,
    }
}

fn moe<'m>(plan: &mut Plan<'m>, m: &'m Moe, index: usize) -> Result<GpuMoe> {
    // One projection of every expert of the rank, stacked.
    let mut stacked = |what: &str, of: fn(&'m Mlp) -> &'m Matrix| -> Result<GpuMatrixData> {
        let parts: Vec<_> = m.experts.iter().map(of).collect();
        Ok(plan.stacked(what, &parts)?.data)
    };
    let up = stacked("expert up weights", |e| &e.up)?;
    let gate = match m.cfg.activation {
        FfnActivation::SwiGlu => Some(stacked("expert gate weights", |e| {
            e.gate.as_ref().expect("SwiGLU experts have a gate")
        })?),
        FfnActivation::Relu2 => None,
    };
    let down = stacked("expert down weights", |e| &e.down)?;
    Ok(GpuMoe {
        kind: router_kind(&m.cfg.router),
        index,
        shard: ExpertShard {
            num_experts: m.cfg.num_experts,
            first: m.local.start,
            num_local: m.local.len(),
        },
        top_k: m.cfg.top_k,
        inter: m.cfg.expert_intermediate,
        activation: m.cfg.activation,
        router: plan.matrix(&m.router),
        router_bias: m.router_bias.as_deref().map(|b| plan.vector(b)),
        up,
        gate,
        down,
        shared: m.shared.as_ref().map(|s| mlp(plan, s)),
    })
}

/// The model's router function as the router kernel names it.
fn router_kind(kind: &crate::config::RouterKind) -> RouterKind {
    use crate::config::RouterKind as K;
    match *kind {
        K::SoftmaxTopK { renormalize } => RouterKind::SoftmaxTopK { renormalize },
        K::TopKSoftmax => RouterKind::TopKSoftmax,
        K::SigmoidGrouped { num_groups, topk_groups, renormalize, scaling } => {
            RouterKind::SigmoidGrouped { num_groups, topk_groups, renormalize, scaling }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(arch: &str) -> Model {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden")
            .join(arch)
            .join("model");
        Model::load(&dir, &mut |_, _| {}).expect("the golden checkpoint loads")
    }

    #[test]
    fn a_refill_lands_in_the_uploaded_spans_and_refuses_another_layout() {
        let dev = CudaDevice::simulated().expect("the simulator opens");
        let model = golden("qwen3_moe");
        let mut weights = GpuWeights::upload(&model, &dev).expect("uploaded");
        let norm = weights.final_norm;
        // Another precision is another kernel: refused before anything is written.
        let mut tensor_cores = golden("qwen3_moe");
        tensor_cores.set_matmul_precision(MatmulPrecision::Bf16);
        assert!(weights.refill(&tensor_cores).is_err());
        // Another model's tensors do not fit either.
        assert!(weights.check_refill(&golden("mixtral")).is_err());
        // The same layout with new values: written where the old ones were.
        let mut scaled = golden("qwen3_moe");
        scaled.final_norm.iter_mut().for_each(|w| *w *= 2.0);
        weights.refill(&scaled).expect("the same layout refills");
        assert!(weights.final_norm == norm, "the spans stay");
        assert_eq!(weights.arena.download(norm).expect("read back"), scaled.final_norm);
    }
}
