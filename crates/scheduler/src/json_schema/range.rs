//! Integers bounded by a range (`minimum`, `maximum`): a digit is read only while some integer
//! in the range still starts with the digits so far.

/// Where a reader is inside a bounded integer: its sign and the digits so far as a value, or
/// `free` once every continuation is in the range (the digits then no longer matter, so the
/// states stop growing with them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct IntPos {
    neg: bool,
    digits: u8,
    value: u64,
    free: bool,
}

/// An inclusive range, either end open.
pub(super) type Range = (Option<i64>, Option<i64>);

impl IntPos {
    /// The first byte of the integer: a minus sign or a digit.
    pub(super) fn start(b: u8, range: Range) -> Option<Self> {
        let none = Self { neg: false, digits: 0, value: 0, free: false };
        match b {
            b'-' => Some(Self { neg: true, ..none }).filter(|p| p.feasible(range)),
            _ => none.next(b, range),
        }
    }

    /// The position after `b`, if it is a digit some integer of the range has there.
    pub(super) fn next(self, b: u8, range: Range) -> Option<Self> {
        if !b.is_ascii_digit() || (self.digits == 1 && self.value == 0 && !self.free) {
            return None;
        }
        if self.free {
            return Some(self);
        }
        let value = self.value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        let next = Self { digits: self.digits + 1, value, ..self };
        if !next.feasible(range) {
            return None;
        }
        // Past the open end's side of the range, every continuation stays in it.
        let (lo, hi) = (range.0.map(i128::from), range.1.map(i128::from));
        let v = next.signed();
        let free = value > 0
            && match next.neg {
                false => hi.is_none() && lo.is_none_or(|lo| v >= lo),
                true => lo.is_none() && hi.is_none_or(|hi| v <= hi),
            };
        Some(if free { Self { digits: 1, value: 0, free: true, ..next } } else { next })
    }

    /// Whether the integer may end here: a digit read, the value in the range.
    pub(super) fn may_end(self, range: Range) -> bool {
        self.free || (self.digits > 0 && in_range(self.signed(), range))
    }

    fn signed(self) -> i128 {
        let v = i128::from(self.value);
        if self.neg { -v } else { v }
    }

    /// Whether some integer of the range is these digits, or starts with them.
    fn feasible(self, range: Range) -> bool {
        if self.digits == 0 {
            // A sign alone: any integer of that sign.
            return range.0.is_none_or(|lo| lo <= -1);
        }
        if in_range(self.signed(), range) {
            return true;
        }
        if self.value == 0 {
            return false; // A leading zero is the whole integer.
        }
        let (p, mut scale) = (i128::from(self.value), 1i128);
        // Each count of digits still to come spans one interval; an i64 has at most 19.
        for _ in 0..19 {
            scale *= 10;
            let (low, high) = (p * scale, p * scale + scale - 1);
            let (low, high) = if self.neg { (-high, -low) } else { (low, high) };
            if range.0.is_none_or(|lo| high >= i128::from(lo))
                && range.1.is_none_or(|hi| low <= i128::from(hi))
            {
                return true;
            }
        }
        false
    }
}

fn in_range(v: i128, (lo, hi): Range) -> bool {
    lo.is_none_or(|lo| v >= i128::from(lo)) && hi.is_none_or(|hi| v <= i128::from(hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `text` as a bounded integer: `None` when a byte is refused, else whether it may end.
    fn read(text: &str, range: Range) -> Option<bool> {
        let mut bytes = text.bytes();
        let mut pos = IntPos::start(bytes.next()?, range)?;
        for b in bytes {
            pos = pos.next(b, range)?;
        }
        Some(pos.may_end(range))
    }

    #[test]
    fn every_integer_of_a_range_reads_and_no_other_ends() {
        let ranges = [
            (Some(1), Some(7)),
            (Some(0), None),
            (Some(-15), Some(120)),
            (None, Some(-3)),
            (Some(10), Some(10)),
            (Some(-1000), Some(-990)),
            (Some(5), None),
            (None, None),
        ];
        for range in ranges {
            for v in -1200i64..=1200 {
                let text = v.to_string();
                let fits = in_range(v.into(), range);
                let read = read(&text, range);
                assert_eq!(read == Some(true), fits, "{text} in {range:?}: {read:?}");
                // Every prefix of an integer in the range reads.
                if fits {
                    for cut in 1..text.len() {
                        assert!(
                            super::tests::read(&text[..cut], range).is_some(),
                            "{text} at {cut}"
                        );
                    }
                }
            }
            for text in ["01", "-", "00", "1a", "--1", "-01"] {
                assert_ne!(read(text, range), Some(true), "{text} in {range:?}");
            }
        }
        // Past the open end the digits stop counting: any number of them reads.
        let long = "9".repeat(40);
        assert_eq!(read(&long, (Some(0), None)), Some(true));
        assert_eq!(read(&format!("-{long}"), (None, Some(0))), Some(true));
        assert_eq!(read("-0", (Some(0), Some(0))), None, "no negative integer: no sign");
        assert_eq!(read("-0", (Some(-1), Some(0))), Some(true), "JSON's -0 is 0");
        assert_eq!(read("9223372036854775808", (None, Some(i64::MAX))), None);
    }
}
