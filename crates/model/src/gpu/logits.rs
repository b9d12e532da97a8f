//! The logits of a step: the rows that want them gathered from the final norm's output, the LM
//! head over them in chunks of the logits buffer, the greedy and seeded samples with their
//! logprobs on the device, the prompt positions scored on the device (prompt logprobs), and the
//! rows the host finishes copied back.

use super::{GpuModel, caches::GpuCaches, forward::StepViews};
use crate::error::Result;
use routed_backend::{cuda::DevSlice, step_inputs::PackedStep};

/// What the host gets back from a step's logits.
#[derive(Debug, Default)]
pub struct LogitsOut {
    /// The token of each device row: greedy rows, then seeded-sample rows.
    pub sampled: Vec<u32>,
    /// Each device row's token's logprob under the raw distribution.
    pub logprobs: Vec<f32>,
    /// Each device row's token's rank, when a device row reports logprobs (else empty).
    pub ranks: Vec<u32>,
    /// Each device row's `num_top` most likely tokens with their logprobs, row after row.
    pub top: Vec<(u32, f32)>,
    /// Alternatives per device row in `top`.
    pub num_top: usize,
    /// Each scored row's target's logprob under the raw distribution, in scored-row order.
    pub score_logprobs: Vec<f32>,
    /// Each scored row's target's rank.
    pub score_ranks: Vec<u32>,
    /// Each scored row's `num_score_top` most likely tokens with their logprobs, row after row.
    pub score_top: Vec<(u32, f32)>,
    /// Alternatives per scored row in `score_top`.
    pub num_score_top: usize,
    /// The rows the host finishes, `[num_host_rows, vocab]`, in logits-row order.
    pub host_logits: Vec<f32>,
}

impl GpuModel {
    /// Computes the logits rows of the last [`GpuModel::forward`], samples its device rows and
    /// fetches everything the host needs. Blocks until the device has produced it.
    pub fn finish_logits(
        &self,
        caches: &mut GpuCaches,
        step: &PackedStep,
        out: &mut LogitsOut,
    ) -> Result<()> {
        out.sampled.clear();
        out.logprobs.clear();
        out.ranks.clear();
        out.top.clear();
        out.num_top = 0;
        out.score_logprobs.clear();
        out.score_ranks.clear();
        out.score_top.clear();
        out.num_score_top = step.num_score_top.min(self.config.vocab_size);
        out.host_logits.clear();
        let (total, chunk) = (step.num_logit_rows(), caches.shape.logits_chunk_rows);
        let device_rows = step.num_greedy + step.num_sampled;
        let scored = device_rows..device_rows + step.num_scored;
        let vocab = self.config.vocab_size;
        for start in (0..total).step_by(chunk.max(1)) {
            let rows = chunk.min(total - start);
            self.logits_chunk(caches, start, rows)?;
            if start == 0 && device_rows > 0 {
                self.sample_on_device(caches, step, out)?;
            }
            // The chunk's scored rows, as rows of the chunk.
            let here =
                scored.start.max(start) - start..scored.end.min(start + rows).max(start) - start;
            if !here.is_empty() {
                self.score_on_device(caches, here.clone(), start + here.start - scored.start, out)?;
            }
            let first_host = scored.end.max(start) - start;
            if first_host < rows {
                let logits = caches.arena.get(caches.act.logits)?;
                let part = logits.sub(first_host * vocab, (rows - first_host) * vocab);
                let part = part.expect("the chunk lies inside the logits buffer");
                caches.logits_host.copy_from(part, self.dev.compute_stream())?;
                out.host_logits.extend_from_slice(&caches.logits_host.wait()?[..part.len()]);
            }
        }
        Ok(())
    }

    /// Logits rows `start..start + rows` into the logits buffer's first `rows` rows.
    fn logits_chunk(&self, caches: &GpuCaches, start: usize, rows: usize) -> Result<()> {
        let (dev, a, act) = (&self.dev, &*caches.arena, &caches.act);
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let v = StepViews::new(a, caches.inputs, caches.packer.layout())?;
        let pairs = v.logit_rows.sub(2 * start, 2 * rows).expect("packed with the step");
        let (normed, selected, logits) =
            (a.get(act.normed)?, a.get(act.selected)?, a.get(act.logits)?);
        // A gather of whole rows is a state copy with rows as slots.
        dev.state_copy(normed, selected, pairs, rows, h)?;
        let head = &self.weights.lm_head;
        let w = self.weights.values(head.data)?;
        dev.gemm(selected, w, logits, (rows, head.rows, head.cols))?;
        let scaling = self.config.multipliers.logits_scaling;
        if scaling != 1.0 {
            dev.scale(logits, 1.0 / scaling, rows * vocab)?;
        }
        Ok(())
    }

    /// Greedy rows by argmax, seeded rows by the sampling kernel, each token's logprob; copied to
    /// the host. The rows' logit edits (bias, penalties) are in place while the tokens are
    /// chosen and undone before the logprobs, which are the raw distribution's. Without edits,
    /// each row's token comes with its logprob from one kernel: the log-softmax kernel takes the
    /// greedy rows' first maxima as it reads them, the sampling kernel its rows' normalisers (the
    /// bits `log_softmax` and `gather_logprob` give).
    fn sample_on_device(
        &self,
        caches: &mut GpuCaches,
        step: &PackedStep,
        out: &mut LogitsOut,
    ) -> Result<()> {
        let (dev, vocab) = (&self.dev, self.config.vocab_size);
        let arena = caches.arena.clone();
        let act = &caches.act;
        let (g, s) = (step.num_greedy, step.num_sampled);
        let (logits, sampled) = (arena.get(act.logits)?, arena.get(act.sampled)?);
        let (log_z, logprobs) = (arena.get(act.log_z)?, arena.get(act.logprobs)?);
        let v = StepViews::new(&arena, caches.inputs, caches.packer.layout())?;
        let edits = (step.num_logit_edits > 0).then_some((v.edit_starts, v.logit_edits));
        let saved = arena.get(act.edit_saved)?;
        let rows = (g + s, step.num_logit_edits);
        let fit = "device rows fit the first chunk";
        // The seeded rows, after the greedy ones, and their tokens.
        let seeded = || -> (DevSlice<'_, f32>, DevSlice<'_, u32>) {
            (logits.sub(g * vocab, s * vocab).expect(fit), sampled.sub(g, s).expect(fit))
        };
        match edits {
            // Every row's normaliser from the raw logits, the tokens from the edited ones, then
            // the logprobs from the raw ones again.
            Some(edits) => {
                dev.log_softmax(logits, None, log_z, g + s, vocab)?;
                dev.logit_edits(logits, edits, saved, rows, vocab, false)?;
                if g > 0 {
                    dev.argmax(logits, sampled, g, vocab)?;
                }
                if s > 0 {
                    let (seeded_rows, into) = seeded();
                    dev.sample(seeded_rows, v.sample_params, into, None, s, vocab)?;
                }
                dev.logit_edits(logits, edits, saved, rows, vocab, true)?;
                dev.gather_logprob(logits, sampled, log_z, logprobs, g + s, vocab)?;
            }
            None => {
                if g > 0 {
                    let greedy = (sampled, logprobs);
                    dev.log_softmax_argmax(logits, log_z, greedy, g, vocab)?;
                }
                if s > 0 {
                    let (seeded_rows, into) = seeded();
                    let own = (log_z.sub(g, s).expect(fit), logprobs.sub(g, s).expect(fit));
                    dev.sample(seeded_rows, v.sample_params, into, Some(own), s, vocab)?;
                }
            }
        }
        let stream = dev.compute_stream();
        caches.sampled_host.copy_from(sampled.sub(0, g + s).expect("sized"), stream)?;
        caches.logprobs_host.copy_from(logprobs.sub(0, g + s).expect("sized"), stream)?;
        out.sampled.extend_from_slice(&caches.sampled_host.wait()?[..g + s]);
        out.logprobs.extend_from_slice(&caches.logprobs_host.wait()?[..g + s]);
        if step.wants_ranks {
            self.top_logprobs_on_device(caches, step, out)?;
        }
        Ok(())
    }

    /// Rows `rows` of the logits chunk, scored rows from `first` on: each row's target (its next
    /// prompt token) with its logprob, rank and the step's number of alternatives, copied to the
    /// host (the host sampler's `score`, with the device's normaliser).
    fn score_on_device(
        &self,
        caches: &mut GpuCaches,
        rows: std::ops::Range<usize>,
        first: usize,
        out: &mut LogitsOut,
    ) -> Result<()> {
        let (dev, vocab) = (&self.dev, self.config.vocab_size);
        let (arena, act) = (caches.arena.clone(), &caches.act);
        let v = StepViews::new(&arena, caches.inputs, caches.packer.layout())?;
        let (at, len) = (rows.start, rows.len());
        let fit = "the scored rows fit the chunk";
        let logits = arena.get(act.logits)?.sub(at * vocab, len * vocab).expect(fit);
        let log_z = arena.get(act.log_z)?.sub(at, len).expect(fit);
        let logprobs = arena.get(act.logprobs)?.sub(at, len).expect(fit);
        let targets = v.score_targets.sub(first, len).expect("packed with the step");
        dev.log_softmax(logits, None, log_z, len, vocab)?;
        dev.gather_logprob(logits, targets, log_z, logprobs, len, vocab)?;
        caches.logprobs_host.copy_from(logprobs, dev.compute_stream())?;
        out.score_logprobs.extend_from_slice(&caches.logprobs_host.wait()?[..len]);
        let n = out.num_score_top;
        let into = (&mut out.score_ranks, &mut out.score_top);
        self.ranks_on_device(caches, (at, len), targets, n, into)
    }

    /// The rank of every device row's token and the most alternatives a device row asked for,
    /// copied to the host.
    fn top_logprobs_on_device(
        &self,
        caches: &mut GpuCaches,
        step: &PackedStep,
        out: &mut LogitsOut,
    ) -> Result<()> {
        let arena = caches.arena.clone();
        let rows = step.num_greedy + step.num_sampled;
        let n = step.num_top_logprobs.min(self.config.vocab_size);
        let sampled = arena.get(caches.act.sampled)?.sub(0, rows).expect("sized");
        self.ranks_on_device(caches, (0, rows), sampled, n, (&mut out.ranks, &mut out.top))?;
        out.num_top = n;
        Ok(())
    }

    /// Rows `at..at + len` of the logits chunk, whose normalisers are in place: the rank of each
    /// row's `chosen` token and the row's `n` most likely tokens with their logprobs
    /// (`top_logprobs_f32`), appended to `ranks` and, `n` per row, to `top`.
    fn ranks_on_device(
        &self,
        caches: &mut GpuCaches,
        (at, len): (usize, usize),
        chosen: DevSlice<'_, u32>,
        n: usize,
        (ranks_out, top_out): (&mut Vec<u32>, &mut Vec<(u32, f32)>),
    ) -> Result<()> {
        let (dev, vocab) = (&self.dev, self.config.vocab_size);
        let (arena, act) = (caches.arena.clone(), &caches.act);
        let fit = "the rows fit the chunk";
        let logits = arena.get(act.logits)?.sub(at * vocab, len * vocab).expect(fit);
        let log_z = arena.get(act.log_z)?.sub(at, len).expect(fit);
        let ranks = arena.get(act.ranks)?.sub(at, len).expect(fit);
        let ids = arena.get(act.top_ids)?.sub(at * n, len * n).expect(fit);
        let lps = arena.get(act.top_logprobs)?.sub(at * n, len * n).expect(fit);
        dev.top_logprobs(logits, chosen, log_z, (ids, lps, n), ranks, len, vocab)?;
        let stream = dev.compute_stream();
        caches.ranks_host.copy_from(ranks, stream)?;
        caches.top_ids_host.copy_from(ids, stream)?;
        caches.top_logprobs_host.copy_from(lps, stream)?;
        ranks_out.extend_from_slice(&caches.ranks_host.wait()?[..len]);
        let (ids, lps) = (caches.top_ids_host.wait()?, caches.top_logprobs_host.wait()?);
        top_out.extend(ids[..len * n].iter().copied().zip(lps[..len * n].iter().copied()));
        Ok(())
    }
}
