//! Go's duration strings (`time.ParseDuration`), as `http_request_timeout` takes them: `50s`, `1m30s`, `1.5s`,
//! `300ms`, `2h45m`; units `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`; a bare `0` is zero.

use std::fmt;
use std::time::Duration;

/// A duration as written, and its value. Negative durations parse (Go's grammar allows a sign) so that the caller can
/// say "must be greater than 0" rather than "not a duration".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoDuration {
    /// The text as given, for messages.
    pub text: String,
    /// Whether it had a leading `-` (and a non-zero value).
    pub negative: bool,
    /// Its magnitude.
    pub value: Duration,
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a string is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Go duration ({reason}); e.g. \"50s\", \"1m30s\", \"1500ms\"")]
pub struct DurationError {
    /// The text.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses `text` as Go's `time.ParseDuration` does (and, like it, refuses more than about 292 years).
pub fn parse(text: &str) -> Result<GoDuration, DurationError> {
    let fail = |reason| DurationError { text: text.to_string(), reason };
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(GoDuration { text: text.to_string(), negative: false, value: Duration::ZERO });
    }
    if rest.is_empty() {
        return Err(fail("empty"));
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(after) => {
                let len = after.bytes().take_while(u8::is_ascii_digit).count();
                after.split_at(len)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(fail("a number must come before each unit"));
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(fail("missing unit"));
        }
        let scale = UNITS.iter().find(|(u, _)| *u == unit).map(|(_, s)| *s).ok_or_else(|| fail("unknown unit"))?;
        let whole: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| fail("too large"))? };
        let mut part = whole.checked_mul(scale).ok_or_else(|| fail("too large"))?;
        // the fraction, to the nanosecond (Go rounds down too)
        let mut divisor: u128 = 1;
        let mut fraction: u128 = 0;
        for digit in frac.bytes().take(30) {
            fraction = fraction * 10 + u128::from(digit - b'0');
            divisor *= 10;
        }
        part += fraction * scale / divisor;
        nanos = nanos.checked_add(part).ok_or_else(|| fail("too large"))?;
        if nanos > i64::MAX as u128 {
            return Err(fail("too large"));
        }
        rest = after;
    }
    let value = Duration::from_nanos(u64::try_from(nanos).map_err(|_| fail("too large"))?);
    Ok(GoDuration { text: text.to_string(), negative: negative && !value.is_zero(), value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        let d = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!d.negative, "{text}");
        d.value
    }

    #[test]
    fn go_examples_parse_to_their_value() {
        assert_eq!(ok("50s"), Duration::from_secs(50));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("2h45m"), Duration::from_secs(2 * 3600 + 45 * 60));
        assert_eq!(ok("1h0m0s"), Duration::from_secs(3600));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10µs"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("1.0000000001s"), Duration::from_secs(1), "below a nanosecond is dropped");
    }

    #[test]
    fn a_minus_sign_is_kept_for_the_caller_to_refuse() {
        let d = parse("-5s").unwrap();
        assert!(d.negative);
        assert_eq!(d.value, Duration::from_secs(5));
        assert!(!parse("-0s").unwrap().negative);
    }

    #[test]
    fn what_go_refuses_is_refused() {
        for (text, reason) in [
            ("", "empty"),
            ("-", "empty"),
            ("50", "missing unit"),
            ("1m30", "missing unit"),
            ("s", "a number must come before each unit"),
            (".s", "a number must come before each unit"),
            ("5 s", "unknown unit"),
            ("5sec", "unknown unit"),
            ("5S", "unknown unit"),
            ("3d", "unknown unit"),
            ("9999999999999999999h", "too large"),
            ("2562048h", "too large"),
        ] {
            assert_eq!(parse(text).map_err(|e| e.reason), Err(reason), "{text:?}");
        }
    }
}
