//! Numbers bounded by `minimum` and `maximum` (exclusive too): a byte is read only while some
//! number within the bounds starts with the text so far.
//!
//! Such a number is written `-?(0|[1-9][0-9]*)(\.[0-9]+)?`, without an exponent (a stricter
//! reading than JSON's, so an answer is always valid), and read as a count of 10^-18 units,
//! the bounds' grid ([`NumberBound`]). Past 18 places a digit can no longer move the number
//! across a bound, only off the grid point below it, so the reader then keeps only whether a
//! non-zero digit came. The text so far stands for an interval of numbers (every way it can go
//! on); a byte is read if that interval meets the bounds, and once it lies within them the
//! digits stop counting, so the reader's states stay few.

use routed_types::NumberBound;

/// A number's bounds, either end open.
pub(super) type Bounds = (Option<NumberBound>, Option<NumberBound>);

/// Where a reader is in the number's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Part {
    /// After the minus sign.
    Sign,
    /// In the integer part (`zero`: it is `0`, and no digit may follow).
    Int { zero: bool },
    /// After the decimal point.
    Point,
    /// In the fraction, `places` digits read (counted up to 19: past the grid).
    Frac { places: u8 },
}

/// Where a reader is inside a bounded number: its sign, its part, its magnitude so far in units
/// (kept as two halves so that a stack frame stays 8-byte aligned), and whether a non-zero digit
/// came past 18 places; or `free` once every continuation is within the bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct DecPos {
    neg: bool,
    part: Part,
    high: u64,
    low: u64,
    past_grid: bool,
    free: bool,
}

/// An end of an interval of numbers in units, and whether the interval holds it; `None` is
/// infinite.
type End = Option<(i128, bool)>;

/// Grid places: a bound has at most this many.
const PLACES: u8 = 18;

impl DecPos {
    /// The first byte of the number: a minus sign or a digit.
    pub(super) fn start(b: u8, bounds: Bounds) -> Option<Self> {
        let sign = Self {
            neg: b == b'-',
            part: Part::Sign,
            high: 0,
            low: 0,
            past_grid: false,
            free: false,
        };
        match b {
            b'-' => Some(sign).filter(|p| p.meets(bounds)),
            _ => sign.next(b, bounds),
        }
    }

    /// The position after `b`, if some number within the bounds has it there.
    pub(super) fn next(self, b: u8, bounds: Bounds) -> Option<Self> {
        let digit = b.is_ascii_digit().then(|| i128::from(b - b'0'));
        let mut next = self;
        let magnitude = self.magnitude();
        next.part = match (self.part, digit) {
            (Part::Sign, Some(d)) => {
                next.set_magnitude(d * NumberBound::ONE);
                Part::Int { zero: d == 0 }
            }
            (Part::Int { zero: false }, Some(d)) => {
                if !self.free {
                    let scaled = magnitude.checked_mul(10)?.checked_add(d * NumberBound::ONE)?;
                    next.set_magnitude(scaled);
                }
                Part::Int { zero: false }
            }
            (Part::Int { .. }, None) if b == b'.' => Part::Point,
            (Part::Point, Some(d)) => {
                next.set_magnitude(magnitude + d * 10i128.pow(u32::from(PLACES) - 1));
                Part::Frac { places: 1 }
            }
            (Part::Frac { places }, Some(d)) if places < PLACES => {
                let unit = 10i128.pow(u32::from(PLACES - places - 1));
                next.set_magnitude(magnitude + d * unit);
                Part::Frac { places: places + 1 }
            }
            (Part::Frac { .. }, Some(d)) => {
                next.past_grid |= d != 0;
                Part::Frac { places: PLACES + 1 }
            }
            _ => return None,
        };
        if self.free {
            return Some(next.freed());
        }
        if !next.meets(bounds) {
            return None;
        }
        Some(match next.within(bounds) {
            true => next.freed(),
            false => next,
        })
    }

    /// The position with only its syntax kept: every continuation is within the bounds.
    fn freed(self) -> Self {
        let part = match self.part {
            Part::Frac { .. } => Part::Frac { places: 1 },
            part => part,
        };
        Self { part, high: 0, low: 0, past_grid: false, free: true, ..self }
    }

    /// Whether the number may end here: a digit last, the number within the bounds.
    pub(super) fn may_end(self, bounds: Bounds) -> bool {
        match self.part {
            Part::Int { .. } | Part::Frac { .. } => {
                self.free || {
                    let (lower, upper) = self.signed(self.point());
                    meets(lower, upper, bounds)
                }
            }
            Part::Sign | Part::Point => false,
        }
    }

    fn magnitude(self) -> i128 {
        ((u128::from(self.high) << 64) | u128::from(self.low)) as i128
    }

    fn set_magnitude(&mut self, units: i128) {
        (self.high, self.low) = ((units as u128 >> 64) as u64, units as u64);
    }

    /// The magnitudes the text so far stands for if it ended here: the number itself, or past
    /// the grid the open interval between its grid point and the next.
    fn point(self) -> (End, End) {
        let m = self.magnitude();
        match self.past_grid {
            false => (Some((m, true)), Some((m, true))),
            true => (Some((m, false)), Some((m + 1, false))),
        }
    }

    /// The magnitudes of every number the text so far can go on to, as one interval (the
    /// integer part's many lengths are checked by [`Self::meets`]).
    fn span(self) -> (End, End) {
        let m = self.magnitude();
        let width = match self.part {
            Part::Sign => return (Some((0, true)), None),
            Part::Int { zero: false } => return (Some((m, true)), None),
            Part::Int { zero: true } | Part::Point => NumberBound::ONE,
            Part::Frac { places } if places <= PLACES => 10i128.pow(u32::from(PLACES - places)),
            Part::Frac { .. } => return (Some((m, !self.past_grid)), Some((m + 1, false))),
        };
        (Some((m, true)), Some((m + width, false)))
    }

    /// An interval of magnitudes as one of numbers, by the sign.
    fn signed(self, (low, high): (End, End)) -> (End, End) {
        let negate = |end: End| end.map(|(v, closed)| (-v, closed));
        match self.neg {
            false => (low, high),
            true => (negate(high), negate(low)),
        }
    }

    /// Whether some number the text can go on to is within the bounds. In the integer part
    /// each count of digits still to come is an interval of its own (`12` goes on to 12 to 13,
    /// 120 to 130, ...): each is tried until they pass every finite bound.
    fn meets(self, bounds: Bounds) -> bool {
        if let Part::Int { zero: false } = self.part {
            let (m, mut scale) = (self.magnitude(), 1i128);
            while let Some(low) = m.checked_mul(scale).filter(|&l| l <= 10 * NumberBound::MAX_UNITS)
            {
                let high = low + NumberBound::ONE * scale;
                let (lower, upper) = self.signed((Some((low, true)), Some((high, false))));
                if meets(lower, upper, bounds) {
                    return true;
                }
                scale *= 10;
            }
            // Longer integer parts lie past every finite bound: within only an open end.
            return match self.neg {
                false => bounds.1.is_none(),
                true => bounds.0.is_none(),
            };
        }
        let (lower, upper) = self.signed(self.span());
        meets(lower, upper, bounds)
    }

    /// Whether every number the text can go on to is within the bounds.
    fn within(self, (minimum, maximum): Bounds) -> bool {
        let (lower, upper) = self.signed(self.span());
        let above = match (minimum, lower) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(b), Some((v, closed))) => {
                v > b.units || (v == b.units && (b.inclusive || !closed))
            }
        };
        let below = match (maximum, upper) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(b), Some((v, closed))) => {
                v < b.units || (v == b.units && (b.inclusive || !closed))
            }
        };
        above && below
    }
}

/// Whether the interval from `lower` to `upper` holds a number within the bounds.
fn meets(lower: End, upper: End, (minimum, maximum): Bounds) -> bool {
    let bound = |b: Option<NumberBound>| b.map(|b| (b.units, b.inclusive));
    // The greater lower end and the lesser upper end; of equal ends, an open one.
    let low = match (lower, bound(minimum)) {
        (Some(a), Some(b)) if a.0 == b.0 => Some((a.0, a.1 && b.1)),
        (Some(a), Some(b)) => Some(if a.0 > b.0 { a } else { b }),
        (a, b) => a.or(b),
    };
    let high = match (upper, bound(maximum)) {
        (Some(a), Some(b)) if a.0 == b.0 => Some((a.0, a.1 && b.1)),
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
        (a, b) => a.or(b),
    };
    match (low, high) {
        (Some((l, l_closed)), Some((h, h_closed))) => l < h || (l == h && l_closed && h_closed),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: i128 = NumberBound::ONE;

    fn at(units: i128, inclusive: bool) -> Option<NumberBound> {
        Some(NumberBound { units, inclusive })
    }

    /// Reads `text`: `None` when a byte is refused, else whether the number may end there.
    fn read(text: &str, bounds: Bounds) -> Option<bool> {
        let mut bytes = text.bytes();
        let mut pos = DecPos::start(bytes.next()?, bounds)?;
        for b in bytes {
            pos = pos.next(b, bounds)?;
        }
        Some(pos.may_end(bounds))
    }

    /// `text`'s value in units, exactly, when it has at most 18 places (else its grid point
    /// below and whether it is past it).
    fn units(text: &str) -> (i128, bool) {
        let (neg, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let mut v = int.parse::<i128>().unwrap() * ONE;
        let mut past = false;
        for (i, c) in frac.bytes().enumerate() {
            let d = i128::from(c - b'0');
            match i < 18 {
                true => v += d * 10i128.pow(17 - i as u32),
                false => past |= d != 0,
            }
        }
        if neg { (-v, past) } else { (v, past) }
    }

    /// Whether the number `text` is within the bounds, by its exact value: past the grid it
    /// lies strictly between its grid point and the next one away from zero.
    fn within(text: &str, (lo, hi): Bounds) -> bool {
        let (v, past) = units(text);
        let neg = text.starts_with('-');
        let above = |b: NumberBound| match (past, neg) {
            (false, _) => v > b.units || (v == b.units && b.inclusive),
            (true, false) => v >= b.units,
            (true, true) => v > b.units,
        };
        let below = |b: NumberBound| match (past, neg) {
            (false, _) => v < b.units || (v == b.units && b.inclusive),
            (true, false) => v < b.units,
            (true, true) => v <= b.units,
        };
        lo.is_none_or(above) && hi.is_none_or(below)
    }

    /// Texts of numbers near the bounds: every integer of -30..30 in tenths, a few long ones.
    fn texts() -> Vec<String> {
        let mut texts = Vec::new();
        for tenths in -300i32..=300 {
            let (neg, t) = (tenths < 0, tenths.unsigned_abs());
            let sign = if neg { "-" } else { "" };
            texts.push(format!("{sign}{}.{}", t / 10, t % 10));
            if t % 10 == 0 {
                texts.push(format!("{sign}{}", t / 10));
            }
            texts.push(format!("{sign}{}.{}5", t / 10, t % 10));
            texts.push(format!("{sign}{}.{}0000000000000000000001", t / 10, t % 10));
            texts.push(format!("{sign}{}.{}99999999999999999999", t / 10, t % 10));
        }
        texts
            .extend(["0", "-0", "-0.0", "1000", "-1000", "12345678901234567890"].map(String::from));
        texts
    }

    #[test]
    fn every_number_within_the_bounds_reads_and_no_other_ends() {
        let bounds = [
            (at(0, true), at(ONE, true)),
            (at(0, false), at(10 * ONE, false)),
            (at(-25 * ONE / 10, true), at(15 * ONE / 10, false)),
            (None, at(-ONE / 2, true)),
            (at(ONE * 5 / 4, false), None),
            (at(3 * ONE / 10, true), at(3 * ONE / 10, true)),
            (at(-20 * ONE, true), at(-195 * ONE / 10, true)),
            (at(1, true), at(2, false)),
            (None, None),
        ];
        for b in bounds {
            for text in texts() {
                let fits = within(&text, b);
                let read = read(&text, b);
                assert_eq!(read == Some(true), fits, "{text} in {b:?}: {read:?}");
                if fits {
                    for cut in 1..text.len() {
                        assert!(
                            super::tests::read(&text[..cut], b).is_some(),
                            "{text} at {cut} in {b:?}"
                        );
                    }
                }
            }
            for text in ["01", "-", "00", "1.", "1e5", "--1", "-01", ".5", "1..2", "0x1"] {
                assert_ne!(read(text, b), Some(true), "{text} in {b:?}");
            }
        }
    }

    #[test]
    fn digits_stop_counting_once_every_continuation_is_within() {
        let bounds = (at(0, true), at(100 * ONE, true));
        let mut pos = DecPos::start(b'3', bounds).unwrap();
        let mut seen = std::collections::HashSet::from([pos]);
        for &b in b".14159265358979323846264338327950288419716939937510" {
            pos = pos.next(b, bounds).unwrap();
            seen.insert(pos);
        }
        assert!(pos.may_end(bounds));
        assert!(seen.len() <= 4, "{} states for one long fraction", seen.len());
        // Near a bound the states are the bound's places at most, and then one past the grid.
        let tight = (None, at(ONE / 3, true));
        let mut pos = DecPos::start(b'0', tight).unwrap();
        let mut seen = std::collections::HashSet::new();
        for &b in b".33333333333333333300000000000000000000000000000" {
            pos = pos.next(b, tight).unwrap();
            seen.insert(pos);
        }
        assert!(pos.may_end(tight));
        assert!(seen.len() <= 21, "{} states", seen.len());
        assert!(pos.next(b'1', tight).is_none(), "past the bound, even past the grid");
    }
}
