//! Store steps: random tokens through random slot mappings, applied to the store and the model.

use std::collections::HashMap;

use rand::RngExt;
use rand::seq::SliceRandom;
use routed_routing::LossReason;
use routed_types::BlockRef;

use super::{Owner, Sim, bgen, bid};

/// One token of a step: its block, offset and row.
struct Token {
    block: usize,
    offset: usize,
    row: Vec<u16>,
}

impl Sim {
    /// Which generation a step names for block `b`, if any: mostly the live one, sometimes a
    /// freed, stale or reallocated-without-notice one.
    fn write_target(&mut self, b: usize) -> Option<u32> {
        let blk = &self.blocks[b];
        let current = blk.generation?;
        let roll = self.rng.random_range(0..10);
        match roll {
            0..7 if blk.owner == Owner::Held => Some(current),
            0..2 if blk.owner == Owner::Cached => Some(current),
            0..2 if blk.owner == Owner::Free && blk.known => Some(current),
            7..9 if !blk.history.is_empty() => {
                Some(blk.history[self.rng.random_range(0..blk.history.len())])
            }
            9 => blk.ghost,
            _ => None,
        }
    }

    fn random_tokens(&mut self, targets: &[(usize, u32)]) -> Vec<Token> {
        let mut tokens = Vec::new();
        let row_len = self.num_layers * self.top_k;
        for &(block, _) in targets {
            for _ in 0..self.rng.random_range(1..=self.block_size + 2) {
                let offset = self.rng.random_range(0..self.block_size);
                let row = (0..row_len)
                    .map(|_| self.rng.random_range(0..self.num_experts) as u16)
                    .collect();
                tokens.push(Token { block, offset, row });
            }
        }
        tokens.shuffle(&mut self.rng);
        tokens
    }

    pub(super) fn op_step(&mut self) {
        let mut targets = Vec::new();
        for _ in 0..self.rng.random_range(0..=4) {
            let b = self.rng.random_range(0..self.blocks.len());
            if targets.iter().any(|&(t, _)| t == b) {
                continue;
            }
            if let Some(g) = self.write_target(b) {
                targets.push((b, g));
            }
        }
        let tokens = self.random_tokens(&targets);
        let (ids, slots) = self.device_layout(&tokens);
        let mut listed: Vec<BlockRef> =
            targets.iter().map(|&(b, g)| BlockRef::new(bid(b), bgen(g))).collect();
        if let Some(&first) = listed.first()
            && self.rng.random_bool(0.2)
        {
            listed.push(first);
        }
        listed.shuffle(&mut self.rng);
        let outcome = self.store.store_step(&ids, &slots, &listed).expect("valid step");
        let order: Vec<(usize, u32)> =
            listed.iter().map(|r| (r.block.index(), r.generation.0)).collect();
        let (written, dropped, refused) = self.apply_step(&order, &tokens);
        assert_eq!(outcome.rows_written, written, "rows written");
        assert_eq!(outcome.rows_dropped, dropped, "rows dropped");
        assert_eq!(outcome.blocks_refused, refused, "blocks refused");
        self.cov.rows_written += written;
        self.cov.rows_dropped += dropped;
        self.cov.refused += refused;
    }

    /// The step as the device hands it over: `(L, N, K)` ids and the slot mapping.
    fn device_layout(&self, tokens: &[Token]) -> (Vec<i16>, Vec<usize>) {
        let (n, k) = (tokens.len(), self.top_k);
        let mut ids = vec![0i16; self.num_layers * n * k];
        for (t, token) in tokens.iter().enumerate() {
            for l in 0..self.num_layers {
                for j in 0..k {
                    ids[(l * n + t) * k + j] = token.row[l * k + j] as i16;
                }
            }
        }
        let slots = tokens.iter().map(|t| t.block * self.block_size + t.offset).collect();
        (ids, slots)
    }

    /// Applies a step to the model; returns (rows written, rows dropped, blocks refused) and
    /// checks the losses it caused.
    fn apply_step(&mut self, order: &[(usize, u32)], tokens: &[Token]) -> (usize, usize, usize) {
        let mut accepted: HashMap<usize, u32> = HashMap::new();
        let mut seen = Vec::new();
        let mut losses = Vec::new();
        let mut refused = 0;
        for &(b, g) in order {
            if seen.contains(&b) {
                continue;
            }
            seen.push(b);
            let blk = &self.blocks[b];
            let live = blk.generation == Some(g) && blk.owner != Owner::Free && blk.lost.is_none();
            if live && !blk.has_rows {
                self.drop_ghost(b);
                self.blocks[b].known = true;
                if self.make_room(&mut losses) {
                    self.blocks[b].has_rows = true;
                    accepted.insert(b, g);
                } else {
                    self.blocks[b].lost = Some(LossReason::Refused);
                    losses.push((b, g, LossReason::Refused));
                    refused += 1;
                }
            } else if live || blk.ghost == Some(g) {
                accepted.insert(b, g);
            }
        }
        let (mut written, mut dropped) = (0, 0);
        for token in tokens {
            let b = token.block;
            let blk = &mut self.blocks[b];
            match accepted.get(&b) {
                Some(&g) if blk.generation == Some(g) && blk.has_rows => {
                    blk.rows.insert(token.offset, token.row.clone());
                    written += 1;
                }
                Some(&g) if blk.ghost == Some(g) => written += 1,
                _ => dropped += 1,
            }
        }
        self.expect_lost(&losses);
        (written, dropped, refused)
    }

    /// Evicts cached-only rows, oldest first, until one more block fits under the cap.
    fn make_room(&mut self, losses: &mut Vec<(usize, u32, LossReason)>) -> bool {
        while self.bytes_blocks() + 1 > self.cap_blocks {
            if self.lru.is_empty() {
                return false;
            }
            let (b, g) = self.lru.remove(0);
            let blk = &mut self.blocks[b];
            if blk.ghost == Some(g) {
                blk.ghost = None;
            } else {
                blk.has_rows = false;
                blk.rows.clear();
                blk.lost = Some(LossReason::Evicted);
            }
            losses.push((b, g, LossReason::Evicted));
            self.cov.evicted += 1;
        }
        true
    }
}
