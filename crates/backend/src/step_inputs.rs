//! A step's inputs packed into one buffer of 4-byte words, for a device worker to upload from
//! pinned memory into a buffer at a fixed device address.
//!
//! [`StepInputLayout`] is the offsets table: a section per input, each at a fixed word offset
//! (aligned to [`SECTION_ALIGN_WORDS`]) sized for the worker's [`StepCapacity`], so the device
//! views of the sections never move (what CUDA graphs need). The block tables come after every
//! fixed section, rows at a stride that follows the step's longest table ([`table_stride`]), and
//! stay on the device from one step to the next: a step writes and uploads only the entries of
//! tables that changed (`step_inputs_tables.rs`). The logit edits come last, uploaded only as far
//! as the step has any. [`StepPacker::uploads`] lists the word ranges a step changed, in a few
//! copies.
//!
//! [`StepPacker::pack`] fills the buffer from a [`StepPlan`] and checks every index the device
//! cannot check (token ids, blocks, state and snapshot slots, positions), as the CPU model does
//! before a forward. It allocates nothing per token: its scratch is reused across steps.
//!
//! Logits rows: the step's final hidden rows that need logits are gathered into rows of a logits
//! buffer, greedy samples first, then seeded samples, then prompt positions scored on the device
//! (prompt logprobs: each row's next prompt token), then rows the host finishes (rows whose bias
//! and penalties do not fit the step's edit list), in plan order within each group. The gather
//! pairs `(token row, logits row)` count logits rows within chunks of
//! [`PackGeometry::logits_chunk_rows`], the rows the logits buffer holds at once. A device
//! row's logit bias and penalties go as per-token edits ([`crate::logit_edits`]), device rows'
//! edits one after another with a start per device row.

use crate::logit_edits::{EditBuilder, LOGIT_EDIT_WORDS, LogitEdit};
use routed_types::{ScheduledSeq, StepPlan};

#[path = "step_inputs_checks.rs"]
mod checks;
#[path = "step_inputs_logits.rs"]
mod logits;
#[path = "step_inputs_tables.rs"]
mod tables;
#[path = "step_inputs_tests.rs"]
#[cfg(test)]
mod tests;

pub use logits::on_device;

/// Every section starts at a multiple of this many words (64 bytes): aligned for any element the
/// sections hold (the sampling parameters have 8-byte fields) and for vector loads.
pub const SECTION_ALIGN_WORDS: usize = 16;

/// Words of one row's sampling parameters (the kernels' `SampleParams`: seed and index as u64,
/// temperature, top-p, top-k, min-p).
pub const SAMPLE_PARAMS_WORDS: usize = 8;

/// What the packed inputs are sized for; fixed for a worker's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCapacity {
    /// Tokens in one step.
    pub max_tokens: usize,
    /// Sequences in one step.
    pub max_seqs: usize,
    /// Block-table entries of one sequence.
    pub max_blocks_per_seq: usize,
    /// Snapshot taps in one step.
    pub max_taps: usize,
    /// Logit edits (bias and penalties, one per touched token) of the device rows of one step;
    /// a row whose edits do not fit is finished on the host.
    pub max_logit_edits: usize,
}

/// How attention splits a sequence's rows into work items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionTiling {
    /// Query heads per KV head: a sequence has `tokens * group` rows.
    pub group: usize,
    /// Rows per work item (the kernel's `ATTN_ROWS`).
    pub rows_per_item: usize,
}

impl AttentionTiling {
    /// Most work items a step can need.
    pub fn max_items(&self, capacity: &StepCapacity) -> usize {
        capacity.max_seqs + capacity.max_tokens * self.group / self.rows_per_item.max(1)
    }
}

/// A `[offset, offset + len)` range of words of the packed buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// First word.
    pub offset: usize,
    /// Words.
    pub len: usize,
}

impl Section {
    /// One past the last word.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// The offsets table of the packed step inputs. All indices are `i32` (token ids `u32`) as the
/// kernels read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepInputLayout {
    /// What the sections are sized for.
    pub capacity: StepCapacity,
    /// Token ids, `[max_tokens]` u32.
    pub token_ids: Section,
    /// Absolute position of each token, `[max_tokens]`.
    pub positions: Section,
    /// KV slot of each token (the slot mapping), `[max_tokens]`.
    pub slot_mapping: Section,
    /// Token offset of each sequence (query starts), `[max_seqs + 1]`.
    pub seq_starts: Section,
    /// Prompt length of each sequence (the dt clamp), `[max_seqs]`.
    pub num_prompt: Section,
    /// Attention work items `(sequence, first row)`, `[max_items, 2]`.
    pub attention_items: Section,
    /// Live state slot of each sequence, `[max_seqs]`.
    pub live_slots: Section,
    /// State copies before the forward, `(snapshot slot or -1 for zeros, live slot)`,
    /// `[max_seqs, 2]`: restores after a prefix hit, clears of sequences starting at 0.
    pub state_copies: Section,
    /// Offsets into `taps` per sequence, `[max_seqs + 1]`.
    pub tap_starts: Section,
    /// Snapshot taps `(position, snapshot slot)`, `[max_taps, 2]`.
    pub taps: Section,
    /// Logits gather pairs `(token row, logits row in its chunk)`, `[max_tokens + max_seqs, 2]`.
    pub logit_rows: Section,
    /// Sampling parameters of the seeded-sample rows, `[max_seqs]` of [`SAMPLE_PARAMS_WORDS`].
    pub sample_params: Section,
    /// The token each scored row predicts (the next prompt token), `[max_tokens]` u32.
    pub score_targets: Section,
    /// Offsets into `logit_edits` per device row (greedy rows, then seeded), `[max_seqs + 1]`.
    pub edit_starts: Section,
    /// Block tables, `[num_seqs, stride]` with the step's stride; after the fixed sections, so a
    /// step uploads only what it uses.
    pub block_tables: Section,
    /// The device rows' logit edits, `[max_logit_edits]` of [`LOGIT_EDIT_WORDS`]; last, uploaded
    /// only as far as a step has edits.
    pub logit_edits: Section,
}

impl StepInputLayout {
    /// The layout for `capacity`; `attention` is `None` for a model without attention layers.
    pub fn new(capacity: StepCapacity, attention: Option<AttentionTiling>) -> Self {
        let c = capacity;
        let mut next = 0;
        let mut push = |len: usize| {
            let s = Section { offset: next, len };
            next = (next + len).next_multiple_of(SECTION_ALIGN_WORDS);
            s
        };
        Self {
            capacity,
            token_ids: push(c.max_tokens),
            positions: push(c.max_tokens),
            slot_mapping: push(c.max_tokens),
            seq_starts: push(c.max_seqs + 1),
            num_prompt: push(c.max_seqs),
            attention_items: push(2 * attention.map_or(0, |a| a.max_items(&c))),
            live_slots: push(c.max_seqs),
            state_copies: push(2 * c.max_seqs),
            tap_starts: push(c.max_seqs + 1),
            taps: push(2 * c.max_taps),
            logit_rows: push(2 * (c.max_tokens + c.max_seqs)),
            sample_params: push(SAMPLE_PARAMS_WORDS * c.max_seqs),
            score_targets: push(c.max_tokens),
            edit_starts: push(c.max_seqs + 1),
            block_tables: push(c.max_seqs * c.max_blocks_per_seq),
            logit_edits: push(LOGIT_EDIT_WORDS * c.max_logit_edits),
        }
    }

    /// Words of the whole buffer.
    pub fn num_words(&self) -> usize {
        self.logit_edits.end()
    }
}

/// Fewest block-table entries per sequence a step is packed with.
pub const MIN_TABLE_STRIDE: usize = 8;

/// The block-table stride of a step whose longest table has `longest` entries: that rounded up
/// to a power of two, at least [`MIN_TABLE_STRIDE`], at most `capacity`. A step's rows are then
/// about as long as its tables (not the longest a sequence may reach: at a 40k-token limit in
/// 16-token blocks, 2,561 entries a sequence), a handful of strides serve every context length
/// (a graph per stride), and the stride changes seldom, so rows stay on the device across steps.
pub fn table_stride(longest: usize, capacity: usize) -> usize {
    longest.next_power_of_two().max(MIN_TABLE_STRIDE).min(capacity)
}

/// The model and pools a step is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackGeometry {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool (the scratch block included).
    pub num_blocks: usize,
    /// Positions must be below this (the rotary table's rows).
    pub max_positions: usize,
    /// `Some(live slots)` for a hybrid model: live slot indices up to it (it is the scratch slot).
    pub num_live_states: Option<usize>,
    /// Snapshot slots.
    pub num_snapshot_slots: usize,
    /// How attention tiles rows, for a model with attention.
    pub attention: Option<AttentionTiling>,
    /// Rows the logits buffer holds at once.
    pub logits_chunk_rows: usize,
}

/// Why a step's inputs were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StepInputError {
    /// More tokens, sequences, taps or table entries than the buffer holds.
    #[error("the step needs {need} {what}, the step inputs hold {capacity}")]
    Capacity {
        /// What ran out.
        what: &'static str,
        /// What the step needs.
        need: usize,
        /// What fits.
        capacity: usize,
    },
    /// An index the device cannot check is out of range, or the sequence is malformed.
    #[error("sequence {seq}: {message}")]
    Bad {
        /// The sequence's index in the plan.
        seq: usize,
        /// What is wrong.
        message: String,
    },
}

/// Where a sequence's logits rows went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitUse {
    /// It wants none (an intermediate chunk, or a rank whose samples are not used).
    None,
    /// Greedy on the device: row `row` of the device results.
    Greedy {
        /// Its row among the device rows.
        row: usize,
    },
    /// Seeded sample on the device: row `row` of the device results.
    Sampled {
        /// Its row among the device rows.
        row: usize,
    },
    /// Finished on the host from logits rows `first..first + len` (counted over every logits
    /// row of the step); the last one is sampled when the sequence samples.
    Host {
        /// Its first logits row.
        first: usize,
        /// Rows: 1, or every position of the chunk for prompt logprobs.
        len: usize,
    },
}

/// A sequence's prompt positions scored on the device (its prompt logprobs this step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreUse {
    /// The sequence's index in the plan.
    pub seq: usize,
    /// Its first scored row, counted over every logits row of the step.
    pub first: usize,
    /// Rows scored: row `r` predicts prompt token `first_position + r`.
    pub len: usize,
    /// The prompt position the first row predicts.
    pub first_position: usize,
    /// Alternatives it asked for.
    pub num_top: usize,
}

/// The counts of one packed step: the kernels' `num_*` arguments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedStep {
    /// Tokens.
    pub num_tokens: usize,
    /// Sequences.
    pub num_seqs: usize,
    /// Attention work items.
    pub num_attention_items: usize,
    /// State copies before the forward.
    pub num_state_copies: usize,
    /// Snapshot taps.
    pub num_taps: usize,
    /// Greedy rows (logits rows `0..num_greedy`).
    pub num_greedy: usize,
    /// Seeded-sample rows (the next `num_sampled` logits rows).
    pub num_sampled: usize,
    /// Prompt positions scored on the device (the next `num_scored` logits rows).
    pub num_scored: usize,
    /// Alternatives every scored row gets: the most any scored sequence asks for.
    pub num_score_top: usize,
    /// Rows the host finishes (the rest).
    pub num_host_rows: usize,
    /// Whether a device row reports logprobs: then every device row gets its token's rank.
    pub wants_ranks: bool,
    /// Alternatives every device row gets: the most any device row asks for.
    pub num_top_logprobs: usize,
    /// Logit edits of the device rows (bias and penalties).
    pub num_logit_edits: usize,
    /// Entries per block-table row this step.
    pub block_table_stride: usize,
}

impl PackedStep {
    /// The words of the logit edits section this step uses.
    pub fn edit_words(&self, layout: &StepInputLayout) -> Section {
        Section { offset: layout.logit_edits.offset, len: self.num_logit_edits * LOGIT_EDIT_WORDS }
    }

    /// Logits rows of the step.
    pub fn num_logit_rows(&self) -> usize {
        self.num_greedy + self.num_sampled + self.num_scored + self.num_host_rows
    }
}

/// Packs steps into a [`StepInputLayout`]; keeps its scratch between steps.
pub struct StepPacker {
    layout: StepInputLayout,
    geometry: PackGeometry,
    uses: Vec<LogitUse>,
    scores: Vec<ScoreUse>,
    /// The scored rows' targets, in order.
    targets: Vec<u32>,
    /// Token row of each logits row, per group, before they are laid out.
    rows: [Vec<usize>; 4],
    /// The logit edits of the greedy and the seeded rows, before they are laid out.
    edits: [Vec<LogitEdit>; 2],
    /// Edits per row of those groups.
    edit_counts: [Vec<usize>; 2],
    builder: EditBuilder,
    /// Every row that wants logits goes to the host ([`StepPacker::sample_on_host`]).
    host_only: bool,
    /// The tables the device's rows hold.
    tables: tables::DeviceTables,
    /// The word ranges the last step changed.
    uploads: Vec<Section>,
    /// Scratch of the uploads' merge.
    gaps: Vec<usize>,
}

const GREEDY: usize = 0;
const SAMPLED: usize = 1;
const SCORED: usize = 2;
const HOST: usize = 3;

impl StepPacker {
    /// A packer for `capacity` over `geometry`.
    pub fn new(capacity: StepCapacity, geometry: PackGeometry) -> Self {
        Self {
            layout: StepInputLayout::new(capacity, geometry.attention),
            geometry,
            uses: Vec::with_capacity(capacity.max_seqs),
            scores: Vec::with_capacity(capacity.max_seqs),
            targets: Vec::with_capacity(capacity.max_tokens),
            rows: std::array::from_fn(|_| Vec::with_capacity(capacity.max_seqs)),
            edits: std::array::from_fn(|_| Vec::with_capacity(capacity.max_logit_edits)),
            edit_counts: std::array::from_fn(|_| Vec::with_capacity(capacity.max_seqs)),
            builder: EditBuilder::default(),
            host_only: false,
            tables: tables::DeviceTables::new(capacity.max_seqs),
            uploads: Vec::with_capacity(capacity.max_seqs + 2),
            gaps: Vec::with_capacity(capacity.max_seqs + 2),
        }
    }

    /// From now on, every row that wants logits goes to the host, prompt logprobs included: the
    /// device only computes logits (to check the device's sampling against the host's).
    pub fn sample_on_host(&mut self) {
        self.host_only = true;
    }

    /// The offsets table.
    pub fn layout(&self) -> &StepInputLayout {
        &self.layout
    }

    /// Where each sequence of the last packed step has its logits rows, in plan order.
    pub fn logit_uses(&self) -> &[LogitUse] {
        &self.uses
    }

    /// The prompt positions the last packed step scores on the device, in plan order.
    pub fn score_uses(&self) -> &[ScoreUse] {
        &self.scores
    }

    /// Packs `plan` into `words` (at least [`StepInputLayout::num_words`] long): the same buffer
    /// every step, whose [`StepPacker::uploads`] ranges after each step the device's buffer
    /// receives, since block-table rows the device holds already are not written again.
    /// `wants_logits` is false on ranks whose samples are not used: they compute no logits.
    /// Nothing is written outside the step's uploads; on an error the buffer holds a partial step
    /// and every row counts as unknown to the device.
    pub fn pack(
        &mut self,
        plan: &StepPlan,
        wants_logits: bool,
        words: &mut [u32],
    ) -> Result<PackedStep, StepInputError> {
        self.pack_seqs(plan, plan.seqs.iter(), wants_logits, words)
    }

    /// [`StepPacker::pack`] for a CUDA graph of `batch` sequences: the plan's sequences, then
    /// `pad` (a sequence without logits on the scratch block) until there are `batch`. A graph
    /// replays the sizes it was captured with, so these are fixed by the batch and the tables'
    /// stride alone (a worker keeps a graph per pair).
    pub fn pack_for_graph(
        &mut self,
        plan: &StepPlan,
        pad: &ScheduledSeq,
        batch: usize,
        wants_logits: bool,
        words: &mut [u32],
    ) -> Result<PackedStep, StepInputError> {
        let num_pad = batch.checked_sub(plan.seqs.len()).ok_or(StepInputError::Capacity {
            what: "sequences of a graph's batch",
            need: plan.seqs.len(),
            capacity: batch,
        })?;
        let seqs = plan.seqs.iter().chain(std::iter::repeat_n(pad, num_pad));
        self.pack_seqs(plan, seqs, wants_logits, words)
    }

    /// `seqs` at the stride of the longest table.
    fn pack_seqs<'a>(
        &mut self,
        plan: &StepPlan,
        seqs: impl Iterator<Item = &'a ScheduledSeq> + Clone,
        wants_logits: bool,
        words: &mut [u32],
    ) -> Result<PackedStep, StepInputError> {
        let longest = seqs.clone().map(|s| s.block_table.len()).max().unwrap_or(0);
        let stride = table_stride(longest, self.layout.capacity.max_blocks_per_seq);
        let packed = self.pack_step(plan, seqs, wants_logits, words, stride);
        if packed.is_err() {
            // Rows written into `words` this step will not reach the device.
            self.tables.forget();
        }
        packed
    }

    fn pack_step<'a>(
        &mut self,
        plan: &StepPlan,
        seqs: impl Iterator<Item = &'a ScheduledSeq> + Clone,
        wants_logits: bool,
        words: &mut [u32],
        stride: usize,
    ) -> Result<PackedStep, StepInputError> {
        assert!(words.len() >= self.layout.num_words(), "the buffer is smaller than its layout");
        let mut p = PackedStep { num_seqs: seqs.clone().count(), ..PackedStep::default() };
        self.check_totals(seqs.clone())?;
        p.block_table_stride = stride;
        self.tables.set_stride(stride);
        self.uploads.clear();
        self.uploads.push(Section { offset: 0, len: self.layout.block_tables.offset });
        self.uses.clear();
        self.scores.clear();
        self.targets.clear();
        self.rows.iter_mut().for_each(Vec::clear);
        self.edits.iter_mut().for_each(Vec::clear);
        self.edit_counts.iter_mut().for_each(Vec::clear);
        for (i, s) in seqs.enumerate() {
            self.check_seq(i, s)?;
            self.pack_seq(i, s, &mut p, words);
            self.pack_table(i, s, stride, words);
            let rows = p.num_tokens..p.num_tokens + s.token_ids.len();
            if wants_logits && !logits::scores_on_host(self.host_only, s) {
                self.score(i, s, rows.start);
            }
            let want = if wants_logits { self.logit_kind(s) } else { None };
            self.uses.push(match want {
                None => LogitUse::None,
                Some((HOST, all)) => {
                    let group = &mut self.rows[HOST];
                    let first = group.len();
                    group.extend(if all { rows.clone() } else { rows.end - 1..rows.end });
                    LogitUse::Host { first, len: group.len() - first }
                }
                Some((kind, _)) => {
                    self.rows[kind].push(rows.end - 1);
                    let row = self.rows[kind].len() - 1;
                    if kind == GREEDY {
                        LogitUse::Greedy { row }
                    } else {
                        LogitUse::Sampled { row }
                    }
                }
            });
            p.num_tokens = rows.end;
        }
        put(words, self.layout.seq_starts.offset + p.num_seqs, p.num_tokens);
        put(words, self.layout.tap_starts.offset + p.num_seqs, p.num_taps);
        self.pack_logits(plan, &mut p, words);
        let edits = p.edit_words(&self.layout);
        if edits.len > 0 {
            self.uploads.push(edits);
        }
        tables::coalesce(&mut self.uploads, &mut self.gaps);
        Ok(p)
    }

    /// The sequence's tokens, table, state slot, copies and taps; `p` counts what is in.
    fn pack_seq(&self, i: usize, s: &ScheduledSeq, p: &mut PackedStep, words: &mut [u32]) {
        let (l, g) = (&self.layout, &self.geometry);
        let t0 = p.num_tokens;
        let table = |pos: usize| s.block_table[pos / g.block_size].block.index();
        for (j, &token) in s.token_ids.iter().enumerate() {
            let pos = s.num_computed_tokens + j;
            words[l.token_ids.offset + t0 + j] = token;
            put(words, l.positions.offset + t0 + j, pos);
            put(
                words,
                l.slot_mapping.offset + t0 + j,
                table(pos) * g.block_size + pos % g.block_size,
            );
        }
        put(words, l.seq_starts.offset + i, t0);
        put(words, l.num_prompt.offset + i, s.num_prompt_tokens);
        if let Some(a) = g.attention {
            let num_rows = s.token_ids.len() * a.group;
            for first in (0..num_rows).step_by(a.rows_per_item) {
                let at = l.attention_items.offset + 2 * p.num_attention_items;
                put(words, at, i);
                put(words, at + 1, first);
                p.num_attention_items += 1;
            }
        }
        put(words, l.tap_starts.offset + i, p.num_taps);
        if g.num_live_states.is_none() {
            return;
        }
        let live = s.live_state.unwrap_or(0) as usize;
        put(words, l.live_slots.offset + i, live);
        let copy_from = match s.restore_from {
            Some(slot) => Some(slot.0),
            None if s.num_computed_tokens == 0 => Some(u32::MAX),
            None => None,
        };
        if let Some(src) = copy_from {
            let at = l.state_copies.offset + 2 * p.num_state_copies;
            words[at] = src;
            put(words, at + 1, live);
            p.num_state_copies += 1;
        }
        for &(pos, slot) in &s.snapshots {
            let at = l.taps.offset + 2 * p.num_taps;
            put(words, at, pos);
            words[at + 1] = slot.0;
            p.num_taps += 1;
        }
    }
}

/// Writes a non-negative index as the kernels' `i32`.
fn put(words: &mut [u32], at: usize, value: usize) {
    debug_assert!(value <= i32::MAX as usize, "index {value} does not fit an i32");
    words[at] = value as u32;
}
