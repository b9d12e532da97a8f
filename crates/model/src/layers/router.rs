//! Router math: from one token's router logits to its experts and their weights.
//!
//! Expert ids come out in the engine's canonical order: descending selection score, ties to the
//! lower id. Weights are in the same order, and experts are combined in that order.

use crate::config::RouterKind;
use routed_backend::cpu;

/// Reusable per-thread scratch so routing a token allocates nothing: kept on each pool thread
/// across tokens, layers and steps (a router's scores, a few hundred floats).
#[derive(Default)]
pub(crate) struct RouterScratch {
    scores: Vec<f32>,
    choice: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<RouterScratch> = std::cell::RefCell::default();
}

impl RouterScratch {
    /// Runs `f` with this thread's scratch (`f` must not start parallel work: no re-entry).
    pub(crate) fn with<R>(f: impl FnOnce(&mut RouterScratch) -> R) -> R {
        SCRATCH.with_borrow_mut(f)
    }
}

/// Picks `ids.len()` experts for one token from its router `logits`, writing ids and weights.
pub(crate) fn route(
    kind: &RouterKind,
    logits: &[f32],
    bias: Option<&[f32]>,
    scratch: &mut RouterScratch,
    ids: &mut [usize],
    weights: &mut [f32],
) {
    let RouterScratch { scores, choice } = scratch;
    scores.clear();
    scores.extend_from_slice(logits);
    match kind {
        RouterKind::SoftmaxTopK { renormalize } => {
            cpu::softmax_inplace(scores);
            top_k(scores, ids);
            gather(scores, ids, weights);
            if *renormalize {
                normalize(weights, 0.0);
            }
        }
        RouterKind::TopKSoftmax => {
            top_k(scores, ids);
            gather(scores, ids, weights);
            cpu::softmax_inplace(weights);
        }
        RouterKind::SigmoidGrouped { num_groups, topk_groups, renormalize, scaling } => {
            scores.iter_mut().for_each(|s| *s = 1.0 / (1.0 + (-*s).exp()));
            choice.clear();
            choice.extend(scores.iter().enumerate().map(|(e, s)| s + bias.map_or(0.0, |b| b[e])));
            mask_groups(choice, *num_groups, *topk_groups);
            top_k(choice, ids);
            gather(scores, ids, weights);
            if *renormalize {
                normalize(weights, 1e-20);
            }
            weights.iter_mut().for_each(|w| *w *= scaling);
        }
    }
}

/// The `ids.len()` largest entries of `scores`, descending, ties to the lower index.
pub(crate) fn top_k(scores: &[f32], ids: &mut [usize]) {
    for j in 0..ids.len() {
        let mut best = usize::MAX;
        for (e, &s) in scores.iter().enumerate() {
            if ids[..j].contains(&e) {
                continue;
            }
            if best == usize::MAX || s > scores[best] {
                best = e;
            }
        }
        ids[j] = best;
    }
}

fn gather(scores: &[f32], ids: &[usize], weights: &mut [f32]) {
    for (w, &e) in weights.iter_mut().zip(ids) {
        *w = scores[e];
    }
}

fn normalize(weights: &mut [f32], eps: f32) {
    let sum: f32 = weights.iter().sum::<f32>() + eps;
    weights.iter_mut().for_each(|w| *w /= sum);
}

/// Group-limited routing: a group's score is the sum of its two best experts; experts outside the
/// `topk_groups` best groups are excluded.
fn mask_groups(choice: &mut [f32], num_groups: usize, topk_groups: usize) {
    if num_groups <= 1 || topk_groups >= num_groups {
        return;
    }
    let per_group = choice.len() / num_groups;
    let mut group_scores: Vec<f32> = choice
        .chunks_exact(per_group)
        .map(|g| {
            let mut best = [0usize; 2];
            top_k(g, &mut best[..2.min(per_group)]);
            best[..2.min(per_group)].iter().map(|&i| g[i]).sum()
        })
        .collect();
    let mut keep = vec![0usize; topk_groups];
    top_k(&group_scores, &mut keep);
    group_scores.iter_mut().enumerate().for_each(|(g, _)| {
        if !keep.contains(&g) {
            choice[g * per_group..(g + 1) * per_group].fill(f32::NEG_INFINITY);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_breaks_ties_to_the_lower_id() {
        let mut ids = [0; 2];
        top_k(&[1.0, 3.0, 2.0, 3.0, 0.0, 3.0], &mut ids);
        assert_eq!(ids, [1, 3]);
    }

    #[test]
    fn top_k_then_softmax_weights_sum_to_one() {
        let (mut ids, mut w) = ([0; 2], [0.0; 2]);
        route(
            &RouterKind::TopKSoftmax,
            &[0.1, 2.0, -1.0, 1.0],
            None,
            &mut Default::default(),
            &mut ids,
            &mut w,
        );
        assert_eq!(ids, [1, 3]);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6 && w[0] > w[1]);
    }

    #[test]
    fn sigmoid_bias_chooses_but_does_not_weigh() {
        let kind = RouterKind::SigmoidGrouped {
            num_groups: 1,
            topk_groups: 1,
            renormalize: false,
            scaling: 2.0,
        };
        let (mut ids, mut w) = ([0; 1], [0.0; 1]);
        route(&kind, &[1.0, 0.0], Some(&[0.0, 10.0]), &mut Default::default(), &mut ids, &mut w);
        assert_eq!(ids, [1]);
        assert!((w[0] - 2.0 * 0.5).abs() < 1e-6);
    }

    #[test]
    fn groups_limit_the_choice() {
        let kind = RouterKind::SigmoidGrouped {
            num_groups: 2,
            topk_groups: 1,
            renormalize: true,
            scaling: 1.0,
        };
        let (mut ids, mut w) = ([0; 2], [0.0; 2]);
        // Group 0 = experts 0..2 holds the single best expert, group 1 the best pair.
        route(&kind, &[5.0, -5.0, 2.0, 2.0], None, &mut Default::default(), &mut ids, &mut w);
        assert_eq!(ids, [2, 3]);
    }
}
