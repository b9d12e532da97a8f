//! Launch configurations: grids, blocks and shared memory of every kernel, as plain host
//! arithmetic. The constants mirror the `#define`s of the kernel sources; a test reads the sources
//! and checks that they agree.

/// Input rows per half-warp tile of the matrix products (`GEMM_RM`).
pub const GEMM_RM: usize = 4;
/// Output columns per half-warp tile (`GEMM_RN`).
pub const GEMM_RN: usize = 4;
/// Half-warps per block of the matrix products (`GEMM_HALF_WARPS`).
pub const GEMM_HALF_WARPS: usize = 8;
/// Input rows per block of the staged `f32` matrix products (`GEMM_STAGE_ROWS`).
pub const GEMM_STAGE_ROWS: usize = 16;
/// Most rows for which the matrix products take their thin kernels (each thread reading its own
/// inputs) rather than the staged ones.
pub const GEMM_THIN_MAX_ROWS: usize = 8;
/// Warps per block of the tensor-core products (`MMA_WARPS`).
pub const MMA_WARPS: usize = 4;
/// Output columns per warp of the tensor-core products (`MMA_COLS`): the instruction's 16 rows.
pub const MMA_COLS: usize = 16;
/// Input rows per tensor-core instruction (`MMA_ROWS`): its 8 columns.
pub const MMA_ROWS: usize = 8;
/// Groups of `MMA_ROWS` input rows a warp of the tensor-core products takes at once
/// (`MMA_ROW_GROUPS`).
pub const MMA_ROW_GROUPS: usize = 4;
/// Warps per block of the wide staged tensor-core product (`MMA_STAGE_WARPS`).
pub const MMA_STAGE_WARPS: usize = 8;
/// Groups of `MMA_ROWS` input rows a block of the wide staged tensor-core product shares
/// (`MMA_STAGE_GROUPS`).
pub const MMA_STAGE_GROUPS: usize = 8;
/// Fewest blocks for which a dense product takes a kernel of bigger blocks than the thin one (the
/// `f32` staged kernel, the wide staged tensor-core kernel): two per SM of an H100 (132), so that
/// they still fill the device. Set by reasoning, not yet by measurement (`routed bench kernels`
/// times every kernel at each shape).
pub const GEMM_BIG_MIN_BLOCKS: usize = 264;
/// Threads per block of the row norms, a block a row (`NORM_THREADS`).
pub const NORM_THREADS: usize = 128;
/// Heads per block of the q/k/v heads kernel (`QKV_HEADS_PER_BLOCK`).
pub const QKV_HEADS_PER_BLOCK: usize = 8;
/// Keys per attention tile, aligned at absolute position 0 (`ATTN_TILE`).
pub const ATTN_TILE: usize = 32;
/// Query rows per attention block (`ATTN_ROWS`).
pub const ATTN_ROWS: usize = 16;
/// Threads per attention block (`ATTN_THREADS`).
pub const ATTN_THREADS: usize = 128;
/// Largest head width the attention kernel takes (`ATTN_MAX_HEAD_DIM`).
pub const ATTN_MAX_HEAD_DIM: usize = 128;
/// Tiles per attention partition in the engine: 512 positions. A row's bits depend on it (its
/// online softmax restarts at every partition), never on whether the partitions were split over
/// CTAs.
pub const ATTN_PARTITION_TILES: usize = 16;
/// Tokens (warps) per router block (`ROUTER_WARPS`).
pub const ROUTER_WARPS: usize = 4;
/// Most expert groups the grouped router takes (`ROUTER_MAX_GROUPS`).
pub const ROUTER_MAX_GROUPS: usize = 64;
/// Most experts per token (`ROUTER_MAX_TOP_K`).
pub const ROUTER_MAX_TOP_K: usize = 32;
/// Threads of the single block of the expert sort (`MOE_SORT_THREADS`), a pair each per chunk.
pub const MOE_SORT_THREADS: usize = 256;
/// Rows per pass of the `f32` grouped up (and gate) products (`EXPERT_UP_ROWS`).
pub const EXPERT_UP_ROWS: usize = 8;
/// Rows per pass of the `f32` grouped down product (`EXPERT_DOWN_ROWS`).
pub const EXPERT_DOWN_ROWS: usize = 16;
/// Rows per pass of the tensor-core grouped products.
pub const EXPERT_MMA_ROWS: usize = MMA_ROW_GROUPS * MMA_ROWS;
/// Most blocks sharing the rows of one expert's column tile in a grouped expert product.
pub const MOE_MAX_ROW_SPLITS: usize = 32;
/// Widest conv1d kernel (`CONV_MAX_KERNEL`).
pub const CONV_MAX_KERNEL: usize = 8;
/// Threads per row of the sampling kernels (`SAMPLE_THREADS`).
pub const SAMPLE_THREADS: usize = 512;
/// Most blocks (a thread block cluster, the portable limit) per row of the row-wide sampling
/// kernels (log-softmax, seeded sampling, top logprobs; `SAMPLE_CLUSTER`).
pub const SAMPLE_CLUSTER: usize = 8;
/// Fewest tokens a thread of those kernels takes per pass over a row before a row is spread over
/// more blocks: below it a cluster's barriers cost more than the blocks save.
pub const SAMPLE_MIN_TOKENS_PER_THREAD: usize = 4;
/// Most alternatives of logprobs a row reports (`TOP_LOGPROBS_MAX`; the API's limit).
pub const TOP_LOGPROBS_MAX: usize = routed_types::MAX_LOGPROBS as usize;
/// Dynamic shared memory of a block of those kernels (`SAMPLE_SMEM_BYTES`).
pub const SAMPLE_SMEM_BYTES: usize = 36 << 10;
/// Threads per block of the element-wise kernels.
pub const ELEMENTWISE_THREADS: usize = 256;

/// Static shared memory a block may use without opting in to more.
pub const DEFAULT_SMEM_LIMIT: usize = 48 << 10;

/// A kernel's launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub smem: u32,
    /// Blocks per thread block cluster along x (1: none), given to the driver as the launch's
    /// cluster attribute (`cuLaunchKernelEx`) and to the simulator, which runs a cluster's blocks
    /// together.
    pub cluster: u32,
}

impl Shape {
    fn new(grid: (usize, usize), block: usize, smem: usize) -> Option<Self> {
        Self::new3((grid.0, grid.1, 1), block, smem)
    }

    fn new3(grid: (usize, usize, usize), block: usize, smem: usize) -> Option<Self> {
        let g =
            (u32::try_from(grid.0).ok()?, u32::try_from(grid.1).ok()?, u32::try_from(grid.2).ok()?);
        // The driver's limits: 2^31 - 1 blocks in x, 65535 in y and z.
        if g.0 == 0 || g.1 == 0 || g.2 == 0 || g.0 > i32::MAX as u32 || g.1.max(g.2) > 65_535 {
            return None;
        }
        Some(Self { grid: g, block: (block as u32, 1, 1), smem: smem as u32, cluster: 1 })
    }

    /// Whether the block needs more dynamic shared memory than the default limit.
    pub fn needs_smem_opt_in(&self) -> bool {
        self.smem as usize > DEFAULT_SMEM_LIMIT
    }
}

/// The matrix product of `m` rows by `n` columns: half-warp tiles of `GEMM_RM x GEMM_RN`, the row
/// tiles along x (scheduled first, so blocks sharing weights run together).
pub fn gemm(m: usize, n: usize) -> Option<Shape> {
    let cols_per_block = GEMM_HALF_WARPS * GEMM_RN;
    Shape::new((m.div_ceil(GEMM_RM), n.div_ceil(cols_per_block)), GEMM_HALF_WARPS * 16, 0)
}

/// The one-row matrix product of `m` rows by `n` columns: a half-warp per output, a block row
/// per input row.
pub fn gemm_row(m: usize, n: usize) -> Option<Shape> {
    Shape::new((m, n.div_ceil(GEMM_HALF_WARPS)), GEMM_HALF_WARPS * 16, 0)
}

/// The staged matrix product of `m` rows by `n` columns: blocks of `GEMM_STAGE_ROWS` rows by
/// `GEMM_HALF_WARPS * GEMM_RN` columns (their inputs in static shared memory).
pub fn gemm_staged(m: usize, n: usize) -> Option<Shape> {
    let cols_per_block = GEMM_HALF_WARPS * GEMM_RN;
    Shape::new((m.div_ceil(GEMM_STAGE_ROWS), n.div_ceil(cols_per_block)), GEMM_HALF_WARPS * 16, 0)
}

/// The tensor-core matrix product of `m` rows by `n` columns: warps of `MMA_COLS` columns by
/// `MMA_ROW_GROUPS * MMA_ROWS` rows.
pub fn gemm_mma(m: usize, n: usize) -> Option<Shape> {
    let (cols_per_block, rows_per_block) = (MMA_WARPS * MMA_COLS, MMA_ROW_GROUPS * MMA_ROWS);
    Shape::new((m.div_ceil(rows_per_block), n.div_ceil(cols_per_block)), MMA_WARPS * 32, 0)
}

/// The staged tensor-core matrix product of `m` rows by `n` columns: the thin product's blocks,
/// their inputs in static shared memory.
pub fn gemm_mma_staged(m: usize, n: usize) -> Option<Shape> {
    gemm_mma(m, n)
}

/// The wide staged tensor-core matrix product of `m` rows by `n` columns: blocks of
/// `MMA_STAGE_WARPS * MMA_COLS` columns by `MMA_STAGE_GROUPS * MMA_ROWS` rows.
pub fn gemm_mma_staged_wide(m: usize, n: usize) -> Option<Shape> {
    let cols_per_block = MMA_STAGE_WARPS * MMA_COLS;
    let rows_per_block = MMA_STAGE_GROUPS * MMA_ROWS;
    Shape::new((m.div_ceil(rows_per_block), n.div_ceil(cols_per_block)), MMA_STAGE_WARPS * 32, 0)
}

/// A row norm over `rows` rows (or Mamba2's gated norm over (token, group) pairs): a block a
/// row.
pub fn norm(rows: usize) -> Option<Shape> {
    Shape::new((rows, 1), NORM_THREADS, 0)
}

/// One thread per element of `width`, one block row per token.
pub fn per_token(width: usize, num_tokens: usize) -> Option<Shape> {
    Shape::new((width.div_ceil(ELEMENTWISE_THREADS), num_tokens), ELEMENTWISE_THREADS, 0)
}

/// One thread per element of a flat buffer.
pub fn elementwise(n: usize) -> Option<Shape> {
    Shape::new((n.div_ceil(ELEMENTWISE_THREADS), 1), ELEMENTWISE_THREADS, 0)
}

/// A block of [`ELEMENTWISE_THREADS`] per row of a buffer, its threads along the row.
pub fn per_row(rows: usize) -> Option<Shape> {
    Shape::new((rows, 1), ELEMENTWISE_THREADS, 0)
}

/// The heads of the fused q/k/v projection: a half-warp per head, `QKV_HEADS_PER_BLOCK` heads a
/// block, a block row per token, each head's row in shared memory.
pub fn qkv_heads(num_tokens: usize, num_heads: usize, head_dim: usize) -> Option<Shape> {
    let blocks = num_heads.div_ceil(QKV_HEADS_PER_BLOCK);
    let smem = 4 * QKV_HEADS_PER_BLOCK * head_dim;
    Shape::new((num_tokens, blocks), QKV_HEADS_PER_BLOCK * 16, smem)
}

/// Dynamic shared memory of the attention kernel for `head_dim`: the query rows, a key tile
/// (rows padded by one float against bank conflicts), a value tile and the tile's probabilities.
pub fn attention_smem_bytes(head_dim: usize) -> usize {
    4 * (ATTN_ROWS * head_dim
        + ATTN_TILE * (head_dim + 1)
        + ATTN_TILE * head_dim
        + ATTN_ROWS * ATTN_TILE)
}

/// Attention work items `(sequence, first row)`: sequence `s` has `seq_lens[s] * group` rows
/// (query token major, then the query heads of a KV head), `ATTN_ROWS` per item.
pub fn attention_items(seq_lens: &[usize], group: usize) -> Vec<[i32; 2]> {
    let mut items = Vec::new();
    for (s, &len) in seq_lens.iter().enumerate() {
        for row in (0..len * group).step_by(ATTN_ROWS) {
            items.push([s as i32, row as i32]);
        }
    }
    items
}

/// Attention over `num_items` work items and `num_kv_heads` heads, each CTA taking every
/// partition of its rows (`num_parts` 1) or one of `num_parts` (split).
pub fn attention(
    num_items: usize,
    num_kv_heads: usize,
    head_dim: usize,
    num_parts: usize,
) -> Option<Shape> {
    (head_dim <= ATTN_MAX_HEAD_DIM).then_some(())?;
    let grid = (num_items, num_kv_heads, num_parts);
    Shape::new3(grid, ATTN_THREADS, attention_smem_bytes(head_dim))
}

/// The fold of split attention's partitions: a block per (token, query head).
pub fn attention_combine(num_tokens: usize, num_heads: usize, head_dim: usize) -> Option<Shape> {
    (head_dim <= ATTN_MAX_HEAD_DIM).then_some(())?;
    Shape::new((num_tokens, num_heads), ATTN_MAX_HEAD_DIM, 0)
}

/// Partitions of `part_tiles` tiles that positions below `max_positions` fall in.
pub fn attention_parts(max_positions: usize, part_tiles: usize) -> usize {
    max_positions.div_ceil(ATTN_TILE * part_tiles.max(1)).max(1)
}

/// Floats of router scratch per warp: scores, choices, taken flags (bytes), group scores, ids,
/// weights.
pub fn router_warp_floats(num_experts: usize) -> usize {
    2 * num_experts + num_experts.div_ceil(4) + ROUTER_MAX_GROUPS + 2 * ROUTER_MAX_TOP_K
}

/// The router over `num_tokens` tokens: a warp each.
pub fn router(num_tokens: usize, num_experts: usize) -> Option<Shape> {
    let smem = 4 * ROUTER_WARPS * router_warp_floats(num_experts);
    Shape::new((num_tokens.div_ceil(ROUTER_WARPS), 1), ROUTER_WARPS * 32, smem)
}

/// The expert sort: one block, each warp's count of every expert and the running counts in
/// shared memory.
pub fn moe_sort(num_experts: usize) -> Option<Shape> {
    let smem = 4 * (MOE_SORT_THREADS / 32 + 1) * num_experts;
    Shape::new((1, 1), MOE_SORT_THREADS, smem)
}

/// How many blocks share the rows of an expert's column tile in a grouped expert product whose
/// passes take `pass_rows` rows, for `num_pairs` (token, expert) pairs over `num_experts`
/// experts: enough that an expert routed twice its mean share of the pairs takes one pass per
/// block, so that the busiest experts are not walked by one block each while the rest of the
/// device idles; at most [`MOE_MAX_ROW_SPLITS`]. A function of the step's size only, never of its
/// routing, so a decode graph's launch holds for every replay.
pub fn moe_row_splits(num_pairs: usize, num_experts: usize, pass_rows: usize) -> usize {
    let busy = 2 * num_pairs.div_ceil(num_experts.max(1));
    busy.div_ceil(pass_rows.max(1)).clamp(1, MOE_MAX_ROW_SPLITS)
}

/// A grouped expert product with `cols` outputs per row: a block row per expert of the rank,
/// whatever the routing, `splits` blocks per column tile side by side.
pub fn moe_expert(cols: usize, num_local: usize, splits: usize) -> Option<Shape> {
    let cols_per_block = GEMM_HALF_WARPS * GEMM_RN;
    Shape::new((cols.div_ceil(cols_per_block) * splits, num_local), GEMM_HALF_WARPS * 16, 0)
}

/// Whether a step of `num_pairs` (token, expert) pairs over `num_experts` experts takes the
/// expert products' row kernels (a block per sorted row) rather than the staged ones: at most one
/// pair per expert on average, a decode step of a few tokens, where a staged pass would hold a
/// row or two. A function of the step's size only, as the graphs need.
pub fn moe_takes_row_kernels(num_pairs: usize, num_experts: usize) -> bool {
    num_pairs > 0 && num_pairs <= num_experts
}

/// An expert product's row kernel with `cols` outputs per row over `num_pairs` sorted rows: a
/// block row per sorted row, a column per half-warp.
pub fn moe_expert_row(cols: usize, num_pairs: usize) -> Option<Shape> {
    Shape::new((num_pairs, cols.div_ceil(GEMM_HALF_WARPS)), GEMM_HALF_WARPS * 16, 0)
}

/// A grouped tensor-core expert product with `cols` outputs per row: a block row per expert of
/// the rank, whatever the routing, `splits` blocks per column tile side by side.
pub fn moe_expert_mma(cols: usize, num_local: usize, splits: usize) -> Option<Shape> {
    Shape::new((cols.div_ceil(MMA_WARPS * MMA_COLS) * splits, num_local), MMA_WARPS * 32, 0)
}

/// The conv1d: a thread per channel, a block row per sequence.
pub fn conv1d(conv_dim: usize, num_seqs: usize) -> Option<Shape> {
    Shape::new((conv_dim.div_ceil(128), num_seqs), 128, 0)
}

/// The scan: a block per (head, sequence), a thread per head channel, the head's state in shared
/// memory.
pub fn scan(
    num_heads: usize,
    num_seqs: usize,
    head_dim: usize,
    state_size: usize,
) -> Option<Shape> {
    let threads = head_dim.div_ceil(32) * 32;
    (threads <= 1024).then_some(())?;
    Shape::new((num_heads, num_seqs), threads, 4 * (state_size * head_dim + 2 * state_size))
}

/// The logit edits of `rows` rows: a block of 128 threads each (rows have few edits).
pub fn logit_edits(rows: usize) -> Option<Shape> {
    Shape::new((rows, 1), 128, 0)
}

/// argmax over `rows` rows: a block each.
pub fn sample(rows: usize) -> Option<Shape> {
    Shape::new((rows, 1), SAMPLE_THREADS, 0)
}

/// Blocks per row of `vocab` logits in the row-wide sampling kernels: one where the device has no
/// thread block clusters, else the most, in powers of two up to [`SAMPLE_CLUSTER`], that still
/// give each thread [`SAMPLE_MIN_TOKENS_PER_THREAD`] tokens a pass (8 at the vocabularies of
/// Qwen3, Mixtral, Nemotron-H and Granite 4.0-H; one at a few thousand). A row's bits depend on it
/// (its reductions span the blocks), and so on the vocabulary and the device alone, never on the
/// batch.
pub fn sample_blocks_per_row(vocab: usize, has_clusters: bool) -> usize {
    let busy = vocab / (SAMPLE_THREADS * SAMPLE_MIN_TOKENS_PER_THREAD);
    match has_clusters && busy > 1 {
        true => (1 << busy.ilog2()).min(SAMPLE_CLUSTER),
        false => 1,
    }
}

/// A row-wide sampling kernel over `rows` rows: a cluster of `blocks_per_row` blocks each
/// ([`sample_blocks_per_row`]), the blocks of a row along x.
pub fn sample_rows(rows: usize, blocks_per_row: usize) -> Option<Shape> {
    let mut shape = Shape::new((blocks_per_row, rows), SAMPLE_THREADS, SAMPLE_SMEM_BYTES)?;
    shape.cluster = blocks_per_row as u32;
    Some(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME value` in the kernel sources.
    fn define(name: &str) -> usize {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let mut found = Vec::new();
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                for line in std::fs::read_to_string(&path).unwrap().lines() {
                    let mut words = line.split_whitespace();
                    if words.next() == Some("#define") && words.next() == Some(name) {
                        found.push(words.next().unwrap().parse::<usize>().unwrap());
                    }
                }
            }
        }
        assert!(!found.is_empty(), "{name} is not defined in kernels/");
        assert!(found.windows(2).all(|w| w[0] == w[1]), "{name} has different values");
        found[0]
    }

    #[test]
    fn constants_match_the_kernel_sources() {
        let pairs = [
            ("GEMM_RM", GEMM_RM),
            ("GEMM_RN", GEMM_RN),
            ("GEMM_HALF_WARPS", GEMM_HALF_WARPS),
            ("GEMM_STAGE_ROWS", GEMM_STAGE_ROWS),
            ("MMA_WARPS", MMA_WARPS),
            ("MMA_COLS", MMA_COLS),
            ("MMA_ROWS", MMA_ROWS),
            ("MMA_ROW_GROUPS", MMA_ROW_GROUPS),
            ("MMA_STAGE_WARPS", MMA_STAGE_WARPS),
            ("MMA_STAGE_GROUPS", MMA_STAGE_GROUPS),
            ("NORM_THREADS", NORM_THREADS),
            ("QKV_HEADS_PER_BLOCK", QKV_HEADS_PER_BLOCK),
            ("ATTN_TILE", ATTN_TILE),
            ("ATTN_ROWS", ATTN_ROWS),
            ("ATTN_THREADS", ATTN_THREADS),
            ("ATTN_MAX_HEAD_DIM", ATTN_MAX_HEAD_DIM),
            ("ROUTER_WARPS", ROUTER_WARPS),
            ("ROUTER_MAX_GROUPS", ROUTER_MAX_GROUPS),
            ("ROUTER_MAX_TOP_K", ROUTER_MAX_TOP_K),
            ("MOE_SORT_THREADS", MOE_SORT_THREADS),
            ("EXPERT_UP_ROWS", EXPERT_UP_ROWS),
            ("EXPERT_DOWN_ROWS", EXPERT_DOWN_ROWS),
            ("CONV_MAX_KERNEL", CONV_MAX_KERNEL),
            ("SAMPLE_THREADS", SAMPLE_THREADS),
            ("SAMPLE_CLUSTER", SAMPLE_CLUSTER),
            ("SAMPLE_SMEM_BYTES", SAMPLE_SMEM_BYTES),
            ("TOP_LOGPROBS_MAX", TOP_LOGPROBS_MAX),
        ];
        for (name, value) in pairs {
            assert_eq!(define(name), value, "{name}");
        }
    }

    #[test]
    fn gemm_grids_cover_every_output_once() {
        let s = gemm(1, 4096).unwrap();
        assert_eq!((s.grid, s.block), ((1, 128, 1), (128, 1, 1)));
        let s = gemm(513, 33).unwrap();
        assert_eq!(s.grid, (129, 2, 1));
        assert!(gemm(0, 8).is_none() && gemm(8, 0).is_none());
        assert!(gemm(65_536 * GEMM_RM, 8).is_some(), "rows along x: 2^31 - 1 blocks");
        assert!(gemm(8, 65_536 * 32).is_none(), "grid y over the driver's limit");
        // 64 columns and 32 rows per block of the tensor-core product.
        let s = gemm_mma(1, 4096).unwrap();
        assert_eq!((s.grid, s.block), ((1, 64, 1), (128, 1, 1)));
        assert_eq!(gemm_mma(513, 65).unwrap().grid, (17, 2, 1));
        assert!(gemm_mma(0, 8).is_none() && gemm_mma(8, 0).is_none());
        // 16 rows and 32 columns per block of the staged f32 product.
        // A column per half-warp, a block row per input row.
        assert_eq!(gemm_row(1, 1024).unwrap().grid, (1, 128, 1));
        assert_eq!(gemm_row(2, 9).unwrap().grid, (2, 2, 1));
        let s = gemm_staged(64, 151_936).unwrap();
        assert_eq!((s.grid, s.block), ((4, 4748, 1), (128, 1, 1)));
        assert_eq!(gemm_staged(17, 33).unwrap().grid, (2, 2, 1));
        // 128 columns and 64 rows per block of the wide staged one.
        let s = gemm_mma_staged_wide(64, 151_936).unwrap();
        assert_eq!((s.grid, s.block), ((1, 1187, 1), (256, 1, 1)));
        assert_eq!(gemm_mma_staged_wide(65, 129).unwrap().grid, (2, 2, 1));
        assert!(gemm_mma_staged_wide(0, 8).is_none() && gemm_mma_staged_wide(8, 0).is_none());
    }

    #[test]
    fn attention_items_cover_each_sequence_in_row_blocks() {
        // Group 4: a decode token is 4 rows; a 5-token chunk is 20 rows, two items.
        assert_eq!(attention_items(&[1, 5, 1], 4), vec![[0, 0], [1, 0], [1, 16], [2, 0]]);
        assert_eq!(attention_items(&[3], 16), vec![[0, 0], [0, 16], [0, 32]]);
        assert!(attention_items(&[], 4).is_empty());
        let s = attention(4, 2, 128, 1).unwrap();
        assert_eq!((s.grid, s.block.0), ((4, 2, 1), 128));
        assert!(!s.needs_smem_opt_in(), "head_dim 128 fits the default shared memory");
        assert!(attention(4, 2, 256, 1).is_none());
        assert_eq!(attention(4, 2, 64, 80).unwrap().grid, (4, 2, 80));
        assert!(attention(4, 2, 64, 70_000).is_none(), "65535 blocks in z at most");
        assert_eq!(attention_parts(512, ATTN_PARTITION_TILES), 1);
        assert_eq!(attention_parts(513, ATTN_PARTITION_TILES), 2);
        assert_eq!(attention_parts(40_960, ATTN_PARTITION_TILES), 80);
    }

    #[test]
    fn expert_grids_have_a_block_row_per_local_expert() {
        assert_eq!(moe_expert(2048, 128, 1).unwrap().grid, (64, 128, 1));
        assert_eq!(moe_expert_mma(2048, 128, 1).unwrap().grid, (32, 128, 1));
        assert_eq!(moe_expert(384, 64, 3).unwrap().grid, (36, 64, 1), "splits side by side in x");
        assert_eq!(moe_expert_mma(384, 64, 2).unwrap().grid, (12, 64, 1));
    }

    #[test]
    fn busy_experts_are_split_over_blocks_by_the_steps_size() {
        // Decode at batch 1 (8 pairs over 64 experts): a block per expert.
        assert_eq!(moe_row_splits(8, 64, EXPERT_UP_ROWS), 1);
        // Batch 64, top-8: 8 pairs per expert on average, a busy expert 16: two 8-row passes.
        assert_eq!(moe_row_splits(512, 64, EXPERT_UP_ROWS), 2);
        assert_eq!(moe_row_splits(512, 64, EXPERT_DOWN_ROWS), 1);
        assert_eq!(moe_row_splits(512, 64, EXPERT_MMA_ROWS), 1);
        // A 512-token prefill: 64 on average, 128 busy.
        assert_eq!(moe_row_splits(4096, 64, EXPERT_UP_ROWS), 16);
        assert_eq!(moe_row_splits(4096, 64, EXPERT_MMA_ROWS), 4);
        // Long prompts stop at the cap; no step is left without a block.
        assert_eq!(moe_row_splits(1 << 20, 64, EXPERT_UP_ROWS), MOE_MAX_ROW_SPLITS);
        assert_eq!(moe_row_splits(0, 64, EXPERT_UP_ROWS), 1);
    }

    #[test]
    fn the_expert_sort_keeps_a_count_per_warp_and_expert() {
        assert_eq!(moe_sort(64).unwrap().smem as usize, 4 * 9 * 64);
        assert!(!moe_sort(1024).unwrap().needs_smem_opt_in(), "1024 experts in 36 KiB");
    }

    #[test]
    fn a_rows_sampling_blocks_follow_its_vocabulary() {
        assert_eq!(sample_blocks_per_row(151_936, true), SAMPLE_CLUSTER);
        assert_eq!(sample_blocks_per_row(151_936, false), 1, "no clusters before sm_90");
        assert_eq!(sample_blocks_per_row(32_000, true), SAMPLE_CLUSTER, "Mixtral");
        assert_eq!(sample_blocks_per_row(3_000, true), 1);
        assert_eq!(sample_blocks_per_row(5_000, true), 2);
        assert_eq!(sample_blocks_per_row(14_000, true), 4, "powers of two");
    }

    #[test]
    fn a_rows_sampling_blocks_are_one_cluster_along_x() {
        let s = sample_rows(3, SAMPLE_CLUSTER).unwrap();
        assert_eq!((s.grid, s.cluster, s.smem as usize), ((8, 3, 1), 8, SAMPLE_SMEM_BYTES));
        assert!(!s.needs_smem_opt_in());
        assert_eq!(sample_rows(3, 1).unwrap().grid, (1, 3, 1));
        assert!(sample_rows(70_000, 8).is_none(), "rows along y: 65535 at most");
    }

    #[test]
    fn router_and_scan_shared_memory() {
        assert_eq!(router_warp_floats(128), 256 + 32 + 64 + 32 + 32);
        let r = router(9, 128).unwrap();
        assert_eq!((r.grid.0, r.smem), (3, 4 * 4 * 416));
        let s = scan(64, 3, 64, 128).unwrap();
        assert_eq!((s.grid, s.block.0, s.smem), ((64, 3, 1), 64, 4 * (128 * 64 + 256)));
        assert!(scan(8, 1, 128, 128).unwrap().needs_smem_opt_in());
        let h = qkv_heads(5, 24, 128).unwrap();
        assert_eq!((h.grid, h.block.0, h.smem), ((5, 3, 1), 128, 4 * 8 * 128));
        assert_eq!(qkv_heads(70_000, 25, 64).unwrap().grid, (70_000, 4, 1), "tokens along x");
    }
}
