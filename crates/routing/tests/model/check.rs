//! The checks run after every operation.

use rand::RngExt;
use routed_routing::RoutingError;
use routed_types::{BlockRef, RoutingRows};

use super::{Owner, Sim, bgen, bid};

impl Sim {
    /// What reconstructing `table` rows `start..num_rows` must give.
    fn expected(
        &self,
        table: &[(usize, u32)],
        num_rows: usize,
        start: usize,
    ) -> Result<Vec<u16>, RoutingError> {
        let bs = self.block_size;
        let mut ids = Vec::new();
        let mut position = start;
        while position < num_rows {
            let index = position / bs;
            let (from, to) = (position % bs, bs.min(num_rows - index * bs));
            let (b, g) = table[index];
            let (block, generation) = (bid(b), bgen(g));
            let blk = &self.blocks[b];
            if blk.owner == Owner::Free {
                return Err(RoutingError::StaleBlock { position, block, generation });
            }
            if let Some(reason) = blk.lost {
                return Err(RoutingError::RowsLost { position, block, generation, reason });
            }
            for offset in from..to {
                match blk.rows.get(&offset) {
                    Some(row) => ids.extend_from_slice(row),
                    None => {
                        let position = index * bs + offset;
                        return Err(RoutingError::MissingRow {
                            position,
                            block,
                            generation,
                            offset,
                        });
                    }
                }
            }
            position = index * bs + to;
        }
        Ok(ids)
    }

    fn check_table(&mut self, table: &[(usize, u32)], num_rows: usize, start: usize, op: usize) {
        let listed: Vec<BlockRef> =
            table.iter().map(|&(b, g)| BlockRef::new(bid(b), bgen(g))).collect();
        let got = self.store.reconstruct(&listed, num_rows, start);
        let expected = self.expected(table, num_rows, start).map(|ids| RoutingRows {
            start,
            num_rows: num_rows - start,
            num_moe_layers: self.num_layers,
            top_k: self.top_k,
            ids,
        });
        assert_eq!(got, expected, "op {op}: table {table:?} rows {start}..{num_rows}");
        match got {
            Ok(rows) if rows.num_rows == self.block_size => self.cov.full_blocks_ok += 1,
            Err(RoutingError::MissingRow { .. }) => self.cov.missing_errors += 1,
            Err(RoutingError::StaleBlock { .. }) => self.cov.stale_errors += 1,
            Err(RoutingError::RowsLost { .. }) => self.cov.lost_errors += 1,
            _ => {}
        }
    }

    pub(super) fn check_all(&mut self, op: usize) {
        let bs = self.block_size;
        let checkable =
            self.blocks_where(|b| b.generation.is_some() && (b.owner != Owner::Free || b.known));
        for &b in &checkable {
            let g = self.blocks[b].generation.expect("allocated");
            self.check_table(&[(b, g)], bs, 0, op);
        }
        // A multi-block request over a random table, with a random length and start.
        let mut table: Vec<(usize, u32)> = Vec::new();
        for _ in 0..self.rng.random_range(1..=4) {
            if let Some(b) = self.pick(&checkable) {
                table.push((b, self.blocks[b].generation.expect("allocated")));
            }
        }
        let num_rows = self.rng.random_range(0..=table.len() * bs);
        let start = self.rng.random_range(0..=num_rows);
        self.check_table(&table, num_rows, start, op);
        // Rows of an earlier generation never come back.
        let with_history = self.blocks_where(|b| !b.history.is_empty());
        if let Some(b) = self.pick(&with_history) {
            let blk = &self.blocks[b];
            let old = blk.history[self.rng.random_range(0..blk.history.len())];
            if blk.ghost != Some(old) {
                let got = self.store.reconstruct(&[BlockRef::new(bid(b), bgen(old))], bs, 0);
                assert!(
                    matches!(got, Err(ref e) if e.position() == Some(0)),
                    "op {op}: stale block {b} gen {old} gave {got:?}"
                );
            }
        }
        assert_eq!(self.store.bytes_held(), self.bytes_blocks() * self.store.block_bytes());
        assert!(self.store.bytes_held() <= self.store.max_bytes());
        assert_eq!(self.store.num_cached_blocks(), self.lru.len(), "op {op}: cached blocks");
    }
}
