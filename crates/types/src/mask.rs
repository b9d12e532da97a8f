//! Which tokens a constrained request may sample next.

/// One bit per vocabulary token: set where the token may be sampled. Built by the scheduler from
/// a request's output constraint (`response_format`) after each token, read by the samplers, which
/// send every token outside it to minus infinity before choosing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenMask {
    words: Vec<u64>,
    num_tokens: usize,
}

impl TokenMask {
    /// A mask over `num_tokens` tokens allowing none.
    pub fn none(num_tokens: usize) -> Self {
        Self { words: vec![0; num_tokens.div_ceil(64)], num_tokens }
    }

    /// A mask over `num_tokens` tokens allowing every one.
    pub fn all(num_tokens: usize) -> Self {
        let mut words = vec![u64::MAX; num_tokens.div_ceil(64)];
        if let Some(last) = words.last_mut().filter(|_| !num_tokens.is_multiple_of(64)) {
            // Bits past the vocabulary stay clear.
            *last = (1 << (num_tokens % 64)) - 1;
        }
        Self { words, num_tokens }
    }

    /// Allows `token` (ignored outside the vocabulary).
    pub fn allow(&mut self, token: u32) {
        let t = token as usize;
        if t < self.num_tokens {
            self.words[t / 64] |= 1 << (t % 64);
        }
    }

    /// Whether `token` may be sampled; never a token outside the vocabulary.
    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        t < self.num_tokens && self.words[t / 64] & (1 << (t % 64)) != 0
    }

    /// Tokens allowed.
    pub fn num_allowed(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The bits, 64 tokens a word (token `t` is bit `t % 64` of word `t / 64`); bits past the
    /// vocabulary are clear.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Tokens in the vocabulary the mask covers.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_only_what_was_allowed_inside_the_vocabulary() {
        let mut mask = TokenMask::none(130);
        for t in [0, 63, 64, 129, 130, 1000] {
            mask.allow(t);
        }
        assert_eq!(mask.num_allowed(), 4);
        assert!(mask.allows(63) && mask.allows(64) && mask.allows(129));
        assert!(!mask.allows(1) && !mask.allows(130) && !mask.allows(1000));
        for n in [0, 1, 63, 64, 65, 130] {
            let all = TokenMask::all(n);
            assert_eq!((all.num_allowed(), all.allows(n as u32)), (n, false), "{n}");
        }
    }
}
