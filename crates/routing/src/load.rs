//! How many tokens each expert of each MoE layer received, split into prompt (prefill) and
//! generated (decode) positions: the load picture MoE users watch for collapsed or hot experts.

/// Which kind of position a token was computed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// A prompt position (prefill, including recomputation after preemption).
    Prefill,
    /// A generated position (decode).
    Decode,
}

impl Phase {
    /// Both phases, in report order.
    pub const ALL: [Self; 2] = [Self::Prefill, Self::Decode];

    /// The name used in reports and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// Token counts per (MoE layer, expert), per phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLoad {
    num_layers: usize,
    num_experts: usize,
    /// `[layer][expert]`, row-major.
    prefill: Vec<u64>,
    decode: Vec<u64>,
}

impl ExpertLoad {
    /// Zero counts for `num_layers` MoE layers of `num_experts` experts.
    pub fn new(num_layers: usize, num_experts: usize) -> Self {
        let zeros = vec![0; num_layers * num_experts];
        Self { num_layers, num_experts, prefill: zeros.clone(), decode: zeros }
    }

    /// MoE layers.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Experts per layer.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Counts one step's choices: `ids` is `(L, N, K)`, `is_prompt[t]` says whether token `t` was
    /// at a prompt position. Ids outside `0..num_experts` are skipped (the store refuses them).
    pub fn record(&mut self, ids: &[i16], is_prompt: &[bool]) {
        let n = is_prompt.len();
        if n == 0 || self.num_layers == 0 {
            return;
        }
        let k = ids.len() / (self.num_layers * n);
        for (l, layer) in ids.chunks_exact(n * k).enumerate().take(self.num_layers) {
            for (token, choice) in layer.chunks_exact(k).enumerate() {
                let counts = if is_prompt[token] { &mut self.prefill } else { &mut self.decode };
                for &e in choice {
                    if let Some(c) = usize::try_from(e)
                        .ok()
                        .filter(|&e| e < self.num_experts)
                        .and_then(|e| counts.get_mut(l * self.num_experts + e))
                    {
                        *c += 1;
                    }
                }
            }
        }
    }

    /// Tokens each expert of MoE layer `layer` received in `phase`.
    pub fn counts(&self, layer: usize, phase: Phase) -> &[u64] {
        let all = match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        };
        &all[layer * self.num_experts..(layer + 1) * self.num_experts]
    }

    /// The busiest expert's count over the mean count of layer `layer` in `phase`: 1 is a
    /// perfectly even load, `num_experts` all tokens on one expert; `None` before any token.
    pub fn imbalance(&self, layer: usize, phase: Phase) -> Option<f64> {
        let counts = self.counts(layer, phase);
        let total: u64 = counts.iter().sum();
        let max = counts.iter().copied().max()?;
        (total > 0).then(|| max as f64 * counts.len() as f64 / total as f64)
    }

    /// Back to zero counts.
    pub fn reset(&mut self) {
        self.prefill.fill(0);
        self.decode.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_split_by_phase_and_layer() {
        let mut load = ExpertLoad::new(2, 4);
        // Two tokens, top-2: token 0 a prompt position, token 1 generated. Layer-major.
        let ids = [0, 1, 2, 1, /* layer 1 */ 3, 3, 0, 2];
        load.record(&ids, &[true, false]);
        assert_eq!(load.counts(0, Phase::Prefill), [1, 1, 0, 0]);
        assert_eq!(load.counts(0, Phase::Decode), [0, 1, 1, 0]);
        assert_eq!(load.counts(1, Phase::Prefill), [0, 0, 0, 2]);
        assert_eq!(load.counts(1, Phase::Decode), [1, 0, 1, 0]);
        assert_eq!(load.imbalance(1, Phase::Prefill), Some(4.0), "all on one expert");
        assert_eq!(load.imbalance(0, Phase::Prefill), Some(2.0));
        load.reset();
        assert_eq!(load.imbalance(0, Phase::Decode), None);
    }

    #[test]
    fn out_of_range_ids_are_skipped() {
        let mut load = ExpertLoad::new(1, 2);
        load.record(&[-1, 5, 1, 1], &[true, true]);
        assert_eq!(load.counts(0, Phase::Prefill), [0, 2]);
    }
}
