//! Scalars' constraints as the reader holds them: a number's bounds on the grid of
//! [`NumberBound`], and a string `format`'s regex.

use std::sync::Arc;

use routed_types::{NumberBound, Regex};
use serde_json::{Map, Value};

use super::compiled;

/// The regex of a string's `format`, where it names one whose values a pattern can spell exactly
/// as validators read them (RFC 3339's dates, times and durations, as JSON Schema defines the
/// formats and pydantic parses `date`, `time`, `datetime` and `timedelta`; UUIDs; IP
/// addresses). A stricter reading: days past the 28th only in months that have them, never the
/// 29th of February, no leap second, a time's offset always written, a duration in days, hours,
/// minutes and whole seconds, an IPv6 address in all eight groups. Any other format stays an
/// annotation, as JSON Schema has it.
pub(super) fn format_regex(fields: &Map<String, Value>) -> Option<Arc<Regex>> {
    macro_rules! date {
        () => {
            concat!(
                r"(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-",
                r"((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
            )
        };
    }
    macro_rules! time {
        () => {
            r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
        };
    }
    // RFC 3339's durations without years, months or weeks (whose length depends on the date).
    macro_rules! duration_time {
        () => {
            r"T([0-9]{1,6}H([0-9]{1,6}M([0-9]{1,6}S)?)?|[0-9]{1,6}M([0-9]{1,6}S)?|[0-9]{1,6}S)"
        };
    }
    macro_rules! octet {
        () => {
            r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
        };
    }
    let pattern = match fields.get("format")?.as_str()? {
        "date" => date!(),
        "time" => time!(),
        "date-time" => concat!(date!(), "T", time!()),
        "duration" => concat!("P([0-9]{1,6}D(", duration_time!(), ")?|", duration_time!(), ")"),
        "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        "ipv4" => concat!(octet!(), r"(\.", octet!(), "){3}"),
        // All eight groups written: no `::`, no IPv4 tail.
        "ipv6" => r"[0-9a-fA-F]{1,4}(:[0-9a-fA-F]{1,4}){7}",
        _ => return None,
    };
    Some(compiled(pattern).expect("the formats' patterns compile"))
}

/// A schema's number as a bound on the grid of [`NumberBound`]: exact where it has at most 18
/// places, else rounded inward (up for a `lower` end, down for an upper one) and then held;
/// `None` beyond 10^18 in size. A fractional number is read as the shortest decimal that
/// parses back to it: the text the client wrote.
pub(super) fn grid_bound(
    n: &serde_json::Number,
    lower: bool,
    inclusive: bool,
) -> Option<NumberBound> {
    if let Some(i) = n.as_i64().map(i128::from) {
        return (i.abs() <= NumberBound::ONE)
            .then_some(NumberBound { units: i * NumberBound::ONE, inclusive });
    }
    let x = n.as_f64().filter(|x| x.is_finite() && x.abs() <= 1e18)?;
    let text = format!("{}", x.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let (places, rest) = frac.split_at(frac.len().min(18));
    let magnitude = int.parse::<i128>().ok()? * NumberBound::ONE
        + format!("{places:0<18}").parse::<i128>().ok()?;
    let units = if x < 0.0 { -magnitude } else { magnitude };
    if rest.bytes().all(|b| b == b'0') {
        return Some(NumberBound { units, inclusive });
    }
    // Cut toward zero: below the number if positive, above it if negative.
    let units = match (lower, x > 0.0) {
        (true, true) => units + 1,
        (false, false) => units - 1,
        _ => units,
    };
    Some(NumberBound { units, inclusive: true })
}
