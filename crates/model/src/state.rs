//! Recurrent-state storage of hybrid models: per Mamba layer, a conv state (the last
//! `conv_kernel - 1` inputs of every conv channel, `[conv_kernel - 1, conv_dim]`) and an SSM state
//! (`[heads, state, head_dim]`, channel-minor so the scan vectorises across channels).
//!
//! Two pools of the same slot layout: live slots (one per running sequence, plus one scratch slot
//! that dummy forwards use) and snapshot slots (copies taken at block boundaries, which a later
//! request restores from after a prefix-cache hit). A forward only writes a snapshot slot when the
//! step plan names it.

use crate::config::MambaConfig;
use routed_types::SnapshotSlotId;

use crate::batch::LiveStateId;

/// The per-layer sizes of one state slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StateLayout {
    pub num_layers: usize,
    pub conv_len: usize,
    pub ssm_len: usize,
}

impl StateLayout {
    pub fn new(cfg: &MambaConfig, num_layers: usize) -> Self {
        Self {
            num_layers,
            conv_len: cfg.conv_dim() * (cfg.conv_kernel - 1),
            ssm_len: cfg.num_heads * cfg.head_dim * cfg.state_size,
        }
    }

    fn layer_len(&self) -> usize {
        self.conv_len + self.ssm_len
    }

    /// Floats in one slot (every Mamba layer).
    pub fn slot_len(&self) -> usize {
        self.num_layers * self.layer_len()
    }
}

/// Live and snapshot state slots of every Mamba layer.
pub struct StateCache {
    layout: StateLayout,
    /// Live slots; the last one is the scratch slot.
    live: Vec<f32>,
    snapshots: Vec<f32>,
    num_live: usize,
    num_snapshots: usize,
}

impl StateCache {
    pub(crate) fn new(layout: StateLayout, num_live: usize, num_snapshots: usize) -> Self {
        let n = layout.slot_len();
        Self {
            layout,
            live: vec![0.0; n * (num_live + 1)],
            snapshots: vec![0.0; n * num_snapshots],
            num_live,
            num_snapshots,
        }
    }

    /// An empty cache for models without Mamba layers.
    pub(crate) fn empty() -> Self {
        Self::new(StateLayout { num_layers: 0, conv_len: 0, ssm_len: 0 }, 0, 0)
    }

    /// Live slots available to sequences (the scratch slot excluded).
    pub fn num_live(&self) -> usize {
        self.num_live
    }

    /// Snapshot slots.
    pub fn num_snapshots(&self) -> usize {
        self.num_snapshots
    }

    /// The scratch live slot reserved for dummy forwards: never a sequence's, never snapshotted.
    pub fn scratch(&self) -> LiveStateId {
        LiveStateId(self.num_live as u32)
    }

    /// Host bytes of all slots.
    pub fn bytes(&self) -> usize {
        (self.live.len() + self.snapshots.len()) * size_of::<f32>()
    }

    /// A live slot's contents (every layer), for checksums and tests.
    pub fn live_slot(&self, id: LiveStateId) -> &[f32] {
        let n = self.layout.slot_len();
        &self.live[id.0 as usize * n..(id.0 as usize + 1) * n]
    }

    /// A snapshot slot's contents.
    pub fn snapshot_slot(&self, id: SnapshotSlotId) -> &[f32] {
        let n = self.layout.slot_len();
        &self.snapshots[id.index() * n..(id.index() + 1) * n]
    }

    pub(crate) fn check_live(&self, id: LiveStateId) -> bool {
        (id.0 as usize) <= self.num_live
    }

    pub(crate) fn check_snapshot(&self, id: SnapshotSlotId) -> bool {
        id.index() < self.num_snapshots
    }

    /// Zeroes a live slot (a sequence starting from position 0).
    pub(crate) fn clear_live(&mut self, id: LiveStateId) {
        let n = self.layout.slot_len();
        self.live[id.0 as usize * n..(id.0 as usize + 1) * n].fill(0.0);
    }

    /// Copies a snapshot into a live slot (restore after a prefix hit).
    pub(crate) fn restore(&mut self, from: SnapshotSlotId, into: LiveStateId) {
        let n = self.layout.slot_len();
        let src = &self.snapshots[from.index() * n..(from.index() + 1) * n];
        self.live[into.0 as usize * n..(into.0 as usize + 1) * n].copy_from_slice(src);
    }

    /// The conv and SSM state of Mamba layer `layer` in a live slot.
    pub(crate) fn live_layer_mut(
        &mut self,
        id: LiveStateId,
        layer: usize,
    ) -> (&mut [f32], &mut [f32]) {
        let at = id.0 as usize * self.layout.slot_len() + layer * self.layout.layer_len();
        let (conv, ssm) =
            self.live[at..at + self.layout.layer_len()].split_at_mut(self.layout.conv_len);
        (conv, ssm)
    }

    /// Copies one layer of a live slot into a snapshot slot.
    pub(crate) fn snapshot_layer(&mut self, from: LiveStateId, layer: usize, into: SnapshotSlotId) {
        let len = self.layout.layer_len();
        let src = id_at(from.0 as usize, layer, &self.layout);
        let dst = id_at(into.index(), layer, &self.layout);
        self.snapshots[dst..dst + len].copy_from_slice(&self.live[src..src + len]);
    }
}

fn id_at(slot: usize, layer: usize, layout: &StateLayout) -> usize {
    slot * layout.slot_len() + layer * layout.layer_len()
}
