//! The byte-level pieces of JSON both output readers share: where a reader is inside a string
//! and inside a number (RFC 8259), each a small `Copy` value stepped one byte at a time.

/// Whether `b` is whitespace between JSON's tokens.
pub(crate) fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where a reader is inside a string, after its opening quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum StrPos {
    /// Between characters: any character, an escape or the closing quote may come.
    Chars,
    /// Inside a UTF-8 character, this many continuation bytes still due.
    Utf8(u8),
    /// After a backslash.
    Escape,
    /// In a `\u` escape, this many hex digits still due.
    Unicode(u8),
    /// After `\ud`: the second digit keeps the code unit out of the surrogates (`d800` to
    /// `dfff`), which many JSON readers refuse unpaired.
    UnicodeD,
}

/// What a byte inside a string did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StrStep {
    /// The string goes on, here.
    In(StrPos),
    /// It was the closing quote.
    Closed,
}

impl StrPos {
    /// The step `b` makes: printable ASCII, an escape (`\u` with four hex digits, not a
    /// surrogate), the closing quote, or well-formed UTF-8 (a lead byte of a 2 to 4 byte
    /// sequence, then its continuation bytes); `None` for anything else.
    #[inline]
    pub(crate) fn next(self, b: u8) -> Option<StrStep> {
        use StrPos::*;
        let pos = match self {
            Chars => match b {
                b'"' => return Some(StrStep::Closed),
                b'\\' => Escape,
                0x00..=0x1F | 0x80..=0xC1 | 0xF5..=0xFF => return None,
                0xC2..=0xDF => Utf8(1),
                0xE0..=0xEF => Utf8(2),
                0xF0..=0xF4 => Utf8(3),
                _ => Chars,
            },
            Utf8(left) => match b {
                0x80..=0xBF if left == 1 => Chars,
                0x80..=0xBF => Utf8(left - 1),
                _ => return None,
            },
            Escape => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Chars,
                b'u' => Unicode(4),
                _ => return None,
            },
            Unicode(4) if matches!(b, b'd' | b'D') => UnicodeD,
            Unicode(left) if b.is_ascii_hexdigit() => match left {
                1 => Chars,
                _ => Unicode(left - 1),
            },
            Unicode(_) => return None,
            // After `\ud`, 0 to 7 keeps the code unit below the surrogates.
            UnicodeD if matches!(b, b'0'..=b'7') => Unicode(2),
            UnicodeD => return None,
        };
        Some(StrStep::In(pos))
    }
}

/// Where the reader is within a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Num {
    /// After `-`: a digit must follow.
    Minus,
    /// After a leading `0`: a fraction, an exponent or the end.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`: a digit must follow.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`: a sign or a digit.
    Exp,
    /// After the exponent's sign: a digit must follow.
    ExpSign,
    /// In the exponent digits.
    ExpInt,
}

impl Num {
    /// Whether a number may end here.
    pub(crate) fn may_end(self) -> bool {
        matches!(self, Self::Zero | Self::Int | Self::Frac | Self::ExpInt)
    }

    /// The state after `b`, if `b` continues the number.
    pub(crate) fn next(self, b: u8) -> Option<Self> {
        use Num::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') | (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => Exp,
            (Exp, b'+' | b'-') => ExpSign,
            (Exp | ExpSign | ExpInt, b'0'..=b'9') => ExpInt,
            _ => return None,
        })
    }
}
