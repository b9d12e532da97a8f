//! Chained block hashes.
//!
//! A complete KV block is identified by a 128-bit [`BlockHash`] over its parent block's hash, its
//! token ids and its extra keys. Two blocks hash alike only if the whole prefix that leads to them
//! is alike, so a hash names a prefix, not just a block.
//!
//! The function is fixed and documented so a hash means the same thing in every run, process and
//! platform (routing rows and snapshots can be matched across restarts, and tests can pin golden
//! values): **FNV-1a, 128-bit** (offset basis `0x6c62272e07bb014262b821756295c58d`, prime
//! `2^88 + 0x13b`), one byte at a time, over this byte string:
//!
//! ```text
//! "routed-kv-block-v1"                         domain tag; bump the version to change the encoding
//! 0x00                                         parent: none (first block of a sequence)
//!   | 0x01 parent_hash as u128 little-endian   parent: present
//! num_tokens as u32 LE, then each token id as u32 LE
//! [0x10 salt_len as u32 LE, salt bytes]        extra key: cache salt (first block only)
//! [0x11 first_generated_offset as u32 LE]      extra key: first position in the block that was
//!                                              generated rather than prompt (only for families
//!                                              whose math differs between the two, and only when
//!                                              the block holds a generated position)
//! 0xff                                         end
//! ```
//!
//! FNV-1a is not collision resistant against an adversary; the salt isolates tenants that need it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use routed_types::{BlockHash, TokenId};

const FNV128_OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
const DOMAIN_TAG: &[u8] = b"routed-kv-block-v1";
const TAG_CACHE_SALT: u8 = 0x10;
const TAG_FIRST_GENERATED: u8 = 0x11;
const TAG_END: u8 = 0xff;

/// Streaming 128-bit FNV-1a.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a128 {
    state: u128,
}

impl Default for Fnv1a128 {
    fn default() -> Self {
        Self { state: FNV128_OFFSET_BASIS }
    }
}

impl Fnv1a128 {
    /// Feeds bytes, in order.
    pub fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.state ^= u128::from(byte);
            self.state = self.state.wrapping_mul(FNV128_PRIME);
        }
    }

    /// The digest of everything written so far.
    pub fn finish(&self) -> u128 {
        self.state
    }
}

/// The extra keys mixed into a block's hash beside its tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtraKeys<'a> {
    /// The request's cache salt. Only the first block of a sequence carries it; since every later
    /// hash chains through the first, the salt isolates the whole chain.
    pub cache_salt: Option<&'a str>,
    /// Offset inside the block of its first generated (not prompt) position, when the model's math
    /// differs between prompt and generated positions and the block holds one.
    pub first_generated_offset: Option<usize>,
}

/// Hashes one complete block: `(parent hash, token ids, extra keys)` as documented in the module.
pub fn hash_block_tokens(
    parent: Option<BlockHash>,
    token_ids: &[TokenId],
    extra: &ExtraKeys<'_>,
) -> BlockHash {
    let mut hasher = Fnv1a128::default();
    hasher.write(DOMAIN_TAG);
    match parent {
        None => hasher.write(&[0x00]),
        Some(parent) => {
            hasher.write(&[0x01]);
            hasher.write(&parent.0.to_le_bytes());
        }
    }
    hasher.write(&len_u32(token_ids.len()).to_le_bytes());
    for token in token_ids {
        hasher.write(&token.to_le_bytes());
    }
    if let Some(salt) = extra.cache_salt {
        hasher.write(&[TAG_CACHE_SALT]);
        hasher.write(&len_u32(salt.len()).to_le_bytes());
        hasher.write(salt.as_bytes());
    }
    if let Some(offset) = extra.first_generated_offset {
        hasher.write(&[TAG_FIRST_GENERATED]);
        hasher.write(&len_u32(offset).to_le_bytes());
    }
    hasher.write(&[TAG_END]);
    BlockHash(hasher.finish())
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("block lengths and salts are far below 4 GiB")
}

/// What a sequence's hash chain depends on besides its tokens.
#[derive(Clone, Copy, Debug)]
pub struct ChainParams<'a> {
    /// Tokens per block.
    pub block_size: usize,
    /// Number of prompt tokens; positions at or past it were generated.
    pub num_prompt_tokens: usize,
    /// The request's cache salt, mixed into block 0.
    pub cache_salt: Option<&'a str>,
    /// Whether the model's math differs between prompt and generated positions, so the hash must
    /// say which positions of a block were generated.
    pub hash_generated_positions: bool,
}

/// Extends `hashes` (the chain of `token_ids`' first `hashes.len()` blocks) with the hash of every
/// further complete block of `token_ids`. A trailing partial block is not hashed.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    token_ids: &[TokenId],
    params: &ChainParams<'_>,
) {
    let block_size = params.block_size;
    let num_complete = token_ids.len() / block_size;
    for index in hashes.len()..num_complete {
        let start = index * block_size;
        let first_generated = params.num_prompt_tokens.max(start);
        let first_generated_offset = (params.hash_generated_positions
            && first_generated < start + block_size)
            .then(|| first_generated - start);
        let extra = ExtraKeys {
            cache_salt: if index == 0 { params.cache_salt } else { None },
            first_generated_offset,
        };
        let parent = index.checked_sub(1).map(|p| hashes[p]);
        let hash = hash_block_tokens(parent, &token_ids[start..start + block_size], &extra);
        hashes.push(hash);
    }
}

/// A `HashMap` keyed by [`BlockHash`] that uses the hash's own bits instead of hashing it again.
pub(crate) type BlockHashMap<V> = HashMap<BlockHash, V, BuildHasherDefault<FoldHasher>>;

/// Folds an already uniformly mixed 128-bit key into 64 bits.
#[derive(Default)]
pub(crate) struct FoldHasher {
    state: u64,
}

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys that are not a single u128; mix them in rather than assume.
        for &byte in bytes {
            self.state = (self.state ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u128(&mut self, value: u128) {
        // FNV's low bits are its weakest, so fold the high half in with a multiply.
        let folded = (value as u64) ^ ((value >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.state ^= folded;
    }
}
