//! The block hash is a fixed function: pinned against published FNV-1a vectors and against golden
//! values computed by an independent implementation of the documented encoding.

use routed_cache::{ChainParams, ExtraKeys, Fnv1a128, extend_block_hashes, hash_block_tokens};
use routed_types::BlockHash;

#[test]
fn fnv1a_128_matches_the_published_test_vectors() {
    let digest = |bytes: &[u8]| {
        let mut hasher = Fnv1a128::default();
        hasher.write(bytes);
        hasher.finish()
    };
    assert_eq!(digest(b""), 0x6c62272e07bb014262b821756295c58d);
    assert_eq!(digest(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
    assert_eq!(digest(b"foobar"), 0x343e1662793c64bf6f0d3597ba446f18);
}

#[test]
fn block_hashes_equal_their_golden_values() {
    let none = ExtraKeys::default();
    let h1 = hash_block_tokens(None, &[1, 2, 3, 4], &none);
    assert_eq!(h1, BlockHash(0xaf5d11f211f4ec8d947c2870a034e3af));
    let h2 = hash_block_tokens(Some(h1), &[5, 6, 7, 8], &none);
    assert_eq!(h2, BlockHash(0x6d62e23829688edf09ddf38a9e32496d));
    let salted = ExtraKeys { cache_salt: Some("tenant-a"), ..ExtraKeys::default() };
    let h3 = hash_block_tokens(None, &[1, 2, 3, 4], &salted);
    assert_eq!(h3, BlockHash(0x5a71314d300b0d73f557d76dc5367665));
    let generated = ExtraKeys { first_generated_offset: Some(2), ..ExtraKeys::default() };
    let h4 = hash_block_tokens(Some(h1), &[5, 6, 7, 8], &generated);
    assert_eq!(h4, BlockHash(0x4ce94d6ebc32200d42836e17e9480ffa));
}

fn chain(
    tokens: &[u32],
    num_prompt_tokens: usize,
    salt: Option<&str>,
    generated: bool,
) -> Vec<BlockHash> {
    let params = ChainParams {
        block_size: 4,
        num_prompt_tokens,
        cache_salt: salt,
        hash_generated_positions: generated,
    };
    let mut hashes = Vec::new();
    extend_block_hashes(&mut hashes, tokens, &params);
    hashes
}

#[test]
fn only_complete_blocks_are_hashed_and_extension_is_incremental() {
    let tokens: Vec<u32> = (0..11).collect();
    let all = chain(&tokens, 11, None, false);
    assert_eq!(all.len(), 2);
    let params = ChainParams {
        block_size: 4,
        num_prompt_tokens: 11,
        cache_salt: None,
        hash_generated_positions: false,
    };
    let mut grown = Vec::new();
    extend_block_hashes(&mut grown, &tokens[..5], &params);
    assert_eq!(grown.len(), 1);
    extend_block_hashes(&mut grown, &tokens, &params);
    assert_eq!(grown, all);
}

#[test]
fn identical_blocks_at_different_depths_hash_differently() {
    let zeros = vec![0u32; 16];
    let hashes = chain(&zeros, 16, None, false);
    let distinct: std::collections::HashSet<_> = hashes.iter().collect();
    assert_eq!(distinct.len(), 4);
}

#[test]
fn salt_changes_every_block_through_the_chain() {
    let tokens: Vec<u32> = (0..12).collect();
    let plain = chain(&tokens, 12, None, false);
    let salted = chain(&tokens, 12, Some("s"), false);
    let other = chain(&tokens, 12, Some("t"), false);
    for i in 0..3 {
        assert_ne!(plain[i], salted[i]);
        assert_ne!(salted[i], other[i]);
    }
    assert_eq!(salted, chain(&tokens, 12, Some("s"), false));
}

#[test]
fn generated_positions_enter_the_hash_only_when_the_family_needs_it() {
    let tokens: Vec<u32> = (0..12).collect();
    // Prompt of 6 tokens: block 1 holds positions 4..8, of which 6 and 7 were generated.
    let as_prompt = chain(&tokens, 12, None, true);
    let with_generated = chain(&tokens, 6, None, true);
    assert_eq!(as_prompt[0], with_generated[0]);
    assert_ne!(as_prompt[1], with_generated[1]);
    assert_ne!(as_prompt[2], with_generated[2]);
    // A family whose math does not depend on it hashes prompt and generated tokens alike.
    assert_eq!(chain(&tokens, 12, None, false), chain(&tokens, 6, None, false));
}
