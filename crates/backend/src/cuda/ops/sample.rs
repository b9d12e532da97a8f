//! Argmax, log-softmax and seeded sampling.

use super::{addr_or_null, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, host::SampleParams, launch as cfg},
    logit_edits::LOGIT_EDIT_WORDS,
};

impl CudaDevice {
    /// The first maximum of each of `num_rows` rows (`argmax_f32`).
    pub fn argmax(
        &self,
        logits: DevSlice<'_, f32>,
        out: DevSlice<'_, u32>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::Argmax;
        fits(id, "logits", &logits, num_rows * vocab)?;
        fits(id, "out", &out, num_rows)?;
        let sh = shape(id, cfg::sample(num_rows))?;
        let (logits, out, vocab) = (logits.addr(), out.addr(), int(id, "vocab", vocab)?);
        launch!(self, id, sh, [logits, out, vocab])
    }

    /// Each row's normaliser `log_z = log(sum(exp(x)))` and, when `out` is given, the row's
    /// log-probabilities `x - log_z` (`log_softmax_f32`).
    pub fn log_softmax(
        &self,
        logits: DevSlice<'_, f32>,
        out: Option<DevSlice<'_, f32>>,
        log_z: DevSlice<'_, f32>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        self.launch_log_softmax(logits, out, log_z, None, num_rows, vocab)
    }

    /// Each row's normaliser, as [`CudaDevice::log_softmax`], its first maximum, as
    /// [`CudaDevice::argmax`], from the same read of the rows, and that token's logprob, as
    /// [`CudaDevice::gather_logprob`]: a greedy row's token and logprob in one kernel.
    pub fn log_softmax_argmax(
        &self,
        logits: DevSlice<'_, f32>,
        log_z: DevSlice<'_, f32>,
        (ids, logprobs): (DevSlice<'_, u32>, DevSlice<'_, f32>),
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        self.launch_log_softmax(logits, None, log_z, Some((ids, logprobs)), num_rows, vocab)
    }

    fn launch_log_softmax(
        &self,
        logits: DevSlice<'_, f32>,
        out: Option<DevSlice<'_, f32>>,
        log_z: DevSlice<'_, f32>,
        first_max: Option<(DevSlice<'_, u32>, DevSlice<'_, f32>)>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::LogSoftmax;
        fits(id, "logits", &logits, num_rows * vocab)?;
        fits(id, "log_z", &log_z, num_rows)?;
        if let Some(o) = &out {
            fits(id, "out", o, num_rows * vocab)?;
        }
        if let Some((ids, logprobs)) = &first_max {
            fits(id, "first_max", ids, num_rows)?;
            fits(id, "first_max_logprobs", logprobs, num_rows)?;
        }
        let sh = shape(id, cfg::sample_rows(num_rows, self.sample_blocks_per_row(vocab)))?;
        let (logits, out, log_z) = (logits.addr(), addr_or_null(out), log_z.addr());
        let first = addr_or_null(first_max.map(|f| f.0));
        let first_lp = addr_or_null(first_max.map(|f| f.1));
        let vocab = int(id, "vocab", vocab)?;
        launch!(self, id, sh, [logits, out, log_z, first, first_lp, vocab])
    }

    /// One seeded sample per row with that row's temperature, top-k, min-p and top-p
    /// (`sample_f32`); with `normalised`, also each row's log-softmax normaliser, bit for bit
    /// [`CudaDevice::log_softmax`]'s, without reading the row for it twice more, and the sampled
    /// token's logprob, [`CudaDevice::gather_logprob`]'s. Rows with temperature 0 belong to
    /// [`CudaDevice::argmax`].
    pub fn sample(
        &self,
        logits: DevSlice<'_, f32>,
        params: DevSlice<'_, SampleParams>,
        out: DevSlice<'_, u32>,
        normalised: Option<(DevSlice<'_, f32>, DevSlice<'_, f32>)>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::Sample;
        fits(id, "logits", &logits, num_rows * vocab)?;
        fits(id, "params", &params, num_rows)?;
        fits(id, "out", &out, num_rows)?;
        if let Some((log_z, logprobs)) = &normalised {
            fits(id, "log_z", log_z, num_rows)?;
            fits(id, "logprobs", logprobs, num_rows)?;
        }
        let sh = shape(id, cfg::sample_rows(num_rows, self.sample_blocks_per_row(vocab)))?;
        let (logits, params, out) = (logits.addr(), params.addr(), out.addr());
        let log_z = addr_or_null(normalised.map(|n| n.0));
        let logprobs = addr_or_null(normalised.map(|n| n.1));
        let vocab = int(id, "vocab", vocab)?;
        launch!(self, id, sh, [logits, params, out, log_z, logprobs, vocab])
    }

    /// Applies each row's logit edits (bias and penalties, `crate::logit_edits`) to its row of
    /// `logits`, keeping the raw values in `saved`; with `restore`, puts them back
    /// (`logit_edits_f32`). `edits` are the packed words, [`LOGIT_EDIT_WORDS`] per edit, and
    /// `edit_starts` the offsets per row.
    pub fn logit_edits(
        &self,
        logits: DevSlice<'_, f32>,
        (edit_starts, edits): (DevSlice<'_, i32>, DevSlice<'_, u32>),
        saved: DevSlice<'_, f32>,
        (num_rows, num_edits): (usize, usize),
        vocab: usize,
        restore: bool,
    ) -> Result<(), BackendError> {
        let id = KernelId::LogitEdits;
        fits(id, "logits", &logits, num_rows * vocab)?;
        fits(id, "edit_starts", &edit_starts, num_rows + 1)?;
        fits(id, "edits", &edits, num_edits * LOGIT_EDIT_WORDS)?;
        fits(id, "saved", &saved, num_edits)?;
        let sh = shape(id, cfg::logit_edits(num_rows))?;
        let (logits, starts, edits, saved) =
            (logits.addr(), edit_starts.addr(), edits.addr(), saved.addr());
        let (vocab, restore) = (int(id, "vocab", vocab)?, i32::from(restore));
        launch!(self, id, sh, [logits, starts, edits, saved, vocab, restore])
    }

    /// Each row's chosen token's logprob, `logits[r][ids[r]] - log_z[r]`
    /// (`gather_logprob_f32`).
    pub fn gather_logprob(
        &self,
        logits: DevSlice<'_, f32>,
        ids: DevSlice<'_, u32>,
        log_z: DevSlice<'_, f32>,
        out: DevSlice<'_, f32>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::GatherLogprob;
        fits(id, "logits", &logits, num_rows * vocab)?;
        for (what, s) in [("log_z", &log_z), ("out", &out)] {
            fits(id, what, s, num_rows)?;
        }
        fits(id, "ids", &ids, num_rows)?;
        let sh = shape(id, cfg::elementwise(num_rows))?;
        let (logits, ids, log_z, out) = (logits.addr(), ids.addr(), log_z.addr(), out.addr());
        let (vocab, rows) = (int(id, "vocab", vocab)?, int(id, "rows", num_rows)?);
        launch!(self, id, sh, [logits, ids, log_z, out, vocab, rows])
    }

    /// For rows whose requests ask for logprobs: the rank of each row's `chosen` token and the
    /// row's `top.2` most likely tokens with their logprobs, in the CPU sampler's order
    /// (`top_logprobs_f32`). `top` holds the ids and logprobs, `[num_rows, n]` each.
    #[allow(clippy::too_many_arguments)] // the kernel's own parameters
    pub fn top_logprobs(
        &self,
        logits: DevSlice<'_, f32>,
        chosen: DevSlice<'_, u32>,
        log_z: DevSlice<'_, f32>,
        top: (DevSlice<'_, u32>, DevSlice<'_, f32>, usize),
        ranks: DevSlice<'_, u32>,
        num_rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::TopLogprobs;
        let (top_ids, top_lps, n) = top;
        if n > vocab || n > cfg::TOP_LOGPROBS_MAX {
            let most = cfg::TOP_LOGPROBS_MAX;
            return Err(super::bad(
                id,
                format!("{n} alternatives from a vocabulary of {vocab} (at most {most})"),
            ));
        }
        fits(id, "logits", &logits, num_rows * vocab)?;
        for (what, s) in [("chosen", &chosen), ("ranks", &ranks)] {
            fits(id, what, s, num_rows)?;
        }
        fits(id, "log_z", &log_z, num_rows)?;
        fits(id, "top ids", &top_ids, num_rows * n)?;
        fits(id, "top logprobs", &top_lps, num_rows * n)?;
        let sh = shape(id, cfg::sample_rows(num_rows, self.sample_blocks_per_row(vocab)))?;
        let (logits, chosen, log_z, ranks) =
            (logits.addr(), chosen.addr(), log_z.addr(), ranks.addr());
        let (top_ids, top_lps) = (top_ids.addr(), top_lps.addr());
        // n may be 0 (ranks only): not a positive size, so not through `int`.
        let (vocab, n) = (int(id, "vocab", vocab)?, n as i32);
        launch!(self, id, sh, [logits, chosen, log_z, top_ids, top_lps, ranks, vocab, n])
    }
}
