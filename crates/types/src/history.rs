//! A sequence's tokens as the penalties see them: each distinct token of the prompt and the
//! output, whether the prompt holds it and how often the output does.
//!
//! The repetition penalty touches every distinct token of the prompt and the output, the
//! frequency and presence penalties every distinct token of the output with its count. Gathering
//! those from the whole history before each token sorted the prompt and the output again at
//! every step of every penalised sequence (a 4k-token prompt and a 4k-token output: 12k keys
//! sorted a step). The scheduler keeps one [`TokenCounts`] per such sequence instead, a token
//! added as it is sampled, and each step's plan shares it.

use crate::TokenId;

/// One distinct token of a sequence's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenCount {
    /// The token.
    pub token: TokenId,
    /// Whether the prompt holds it.
    pub in_prompt: bool,
    /// How often the output holds it.
    pub num_in_output: u32,
}

/// The distinct tokens of a prompt and an output, sorted by token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    entries: Vec<TokenCount>,
}

impl TokenCounts {
    /// The counts of `prompt` followed by `output`.
    pub fn new(prompt: &[TokenId], output: &[TokenId]) -> Self {
        let mut tokens = prompt.to_vec();
        tokens.sort_unstable();
        tokens.dedup();
        let entries =
            tokens.into_iter().map(|token| TokenCount { token, in_prompt: true, num_in_output: 0 });
        let mut counts = Self { entries: entries.collect() };
        for &t in output {
            counts.push_output(t);
        }
        counts
    }

    /// The output gained `token`.
    pub fn push_output(&mut self, token: TokenId) {
        match self.entries.binary_search_by_key(&token, |e| e.token) {
            Ok(i) => self.entries[i].num_in_output += 1,
            Err(i) => {
                self.entries.insert(i, TokenCount { token, in_prompt: false, num_in_output: 1 })
            }
        }
    }

    /// Every distinct token, ascending.
    pub fn entries(&self) -> &[TokenCount] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_grow_with_the_output_as_if_built_from_the_whole_history() {
        let prompt = [5, 3, 5, 9];
        let output = [3, 7, 7, 1, 3, 3];
        let mut grown = TokenCounts::new(&prompt, &[]);
        for &t in &output {
            grown.push_output(t);
        }
        assert_eq!(grown, TokenCounts::new(&prompt, &output));
        let entry =
            |token, in_prompt, num_in_output| TokenCount { token, in_prompt, num_in_output };
        assert_eq!(
            grown.entries(),
            [
                entry(1, false, 1),
                entry(3, true, 3),
                entry(5, true, 0),
                entry(7, false, 2),
                entry(9, true, 0)
            ]
        );
    }
}
