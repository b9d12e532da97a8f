//! The routing-replay row layout shared by the model (which produces rows), the routing store
//! (which keeps them per KV block) and the server (which encodes them).

/// A logical expert id, before any expert-parallel placement.
pub type ExpertId = u16;

/// What a consumer needs to interpret routing rows; published per model and per response.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoutingMeta {
    /// Number of decoder layers (`num_hidden_layers`), MoE or not: the layer axis of the
    /// decoder-layer layout that vLLM and SGLang return and RL trainers reshape by.
    pub num_layers: u32,
    /// Index of each MoE layer among all decoder layers, in model order. The layer axis of the
    /// stored rows has one entry per element of this list.
    pub moe_layer_ids: Vec<u32>,
    /// Number of routed experts per MoE layer.
    pub num_experts: u32,
    /// Experts chosen per token per layer.
    pub top_k: u32,
}

impl RoutingMeta {
    /// Number of MoE layers (the `L` of the stored `[rows, L, K]`).
    pub fn num_moe_layers(&self) -> usize {
        self.moe_layer_ids.len()
    }

    /// Number of expert ids in one stored row: `L * K` over the MoE layers.
    pub fn row_len(&self) -> usize {
        self.num_moe_layers() * self.top_k as usize
    }

    /// Whether rows fit in one byte per id (`|u1`), as opposed to two (`<u2`).
    pub fn fits_u8(&self) -> bool {
        self.num_experts <= 256
    }
}

/// A request's routing, row-major `[num_rows, num_moe_layers, top_k]`.
///
/// Row `i` is the routing computed when token `start + i` was the model's input. Within a row, a
/// layer's ids are in descending router score, ties to the lower expert id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingRows {
    /// Index of the first row in the request (rows before it were dropped on request).
    pub start: usize,
    /// Number of rows.
    pub num_rows: usize,
    /// Number of MoE layers per row.
    pub num_moe_layers: usize,
    /// Experts per layer.
    pub top_k: usize,
    /// `num_rows * num_moe_layers * top_k` expert ids.
    pub ids: Vec<ExpertId>,
}

impl RoutingRows {
    /// The `[rows, L, K]` shape.
    pub fn shape(&self) -> [usize; 3] {
        [self.num_rows, self.num_moe_layers, self.top_k]
    }

    /// The ids of one row, `L * K` of them.
    pub fn row(&self, i: usize) -> &[ExpertId] {
        let n = self.num_moe_layers * self.top_k;
        &self.ids[i * n..(i + 1) * n]
    }
}
