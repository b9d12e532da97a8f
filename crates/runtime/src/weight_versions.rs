//! Which weights sampled each output token of a continuation.
//!
//! A continuation can outlive a weight version: paused across a weight update it resumes on the
//! new weights, and a rename (`/update_weight_version`) takes effect mid-request. An RL trainer
//! that corrects for stale samples needs to know where the boundary fell, so every sampled token
//! is stamped with the version the engine served when it was sampled, and the stamps are kept
//! run-length encoded: one span per stretch of tokens on the same version.

use std::sync::Arc;

/// Output tokens `[start, end)` of a continuation, sampled on the weights named `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightVersionSpan {
    /// The weights' version.
    pub version: Arc<str>,
    /// First output token index.
    pub start: usize,
    /// One past the last output token index.
    pub end: usize,
}

/// The versions of a continuation's output tokens so far, as contiguous spans from token 0 whose
/// neighbours have different versions. Pushing a token on the version of the previous one
/// allocates nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightVersions {
    spans: Vec<WeightVersionSpan>,
}

impl WeightVersions {
    /// One more output token, sampled on `version`.
    pub fn push(&mut self, version: &Arc<str>) {
        match self.spans.last_mut() {
            Some(last) if Arc::ptr_eq(&last.version, version) || last.version == *version => {
                last.end += 1;
            }
            last => {
                let start = last.map_or(0, |s| s.end);
                let version = Arc::clone(version);
                self.spans.push(WeightVersionSpan { version, start, end: start + 1 });
            }
        }
    }

    /// Output tokens pushed.
    pub fn num_tokens(&self) -> usize {
        self.spans.last().map_or(0, |s| s.end)
    }

    /// The spans so far; empty before the first token.
    pub fn spans(&self) -> &[WeightVersionSpan] {
        &self.spans
    }

    /// The version of the last token, or `current` before the first.
    pub fn last<'a>(&'a self, current: &'a Arc<str>) -> &'a Arc<str> {
        self.spans.last().map_or(current, |s| &s.version)
    }

    /// The spans of a finished continuation, never empty: one empty span on `current` (the
    /// version served when it ended) when it sampled nothing.
    pub fn into_spans(self, current: &Arc<str>) -> Vec<WeightVersionSpan> {
        if self.spans.is_empty() {
            return vec![WeightVersionSpan { version: Arc::clone(current), start: 0, end: 0 }];
        }
        self.spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(version: &str, start: usize, end: usize) -> WeightVersionSpan {
        WeightVersionSpan { version: version.into(), start, end }
    }

    fn push_all(names: &[&str]) -> WeightVersions {
        let mut v = WeightVersions::default();
        for name in names {
            v.push(&Arc::from(*name));
        }
        v
    }

    #[test]
    fn tokens_on_one_version_make_one_span() {
        let v = push_all(&["a", "a", "a"]);
        assert_eq!(v.spans(), [span("a", 0, 3)]);
        assert_eq!(v.num_tokens(), 3);
    }

    #[test]
    fn each_change_starts_a_span_where_the_last_ended() {
        let v = push_all(&["a", "a", "b", "b", "b", "a"]);
        assert_eq!(v.spans(), [span("a", 0, 2), span("b", 2, 5), span("a", 5, 6)]);
        let current = Arc::from("c");
        assert_eq!(&**v.last(&current), "a", "the last token's version, not the current one");
        assert_eq!(v.into_spans(&current).len(), 3);
    }

    #[test]
    fn equal_names_in_different_allocations_are_one_version() {
        let mut v = WeightVersions::default();
        v.push(&Arc::from("a"));
        v.push(&Arc::from("a"));
        assert_eq!(v.spans(), [span("a", 0, 2)]);
    }

    #[test]
    fn a_continuation_without_tokens_reports_the_current_version() {
        let v = WeightVersions::default();
        let current = Arc::from("now");
        assert_eq!(&**v.last(&current), "now");
        assert_eq!(v.into_spans(&current), [span("now", 0, 0)]);
    }
}
