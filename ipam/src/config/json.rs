//! Typed reads of `serde_json` values that name the key on every mistake, and the unknown-key check.

use serde_json::{Map, Value};

use super::error::{ConfigError, UnknownKey};

/// How a JSON value is described in messages.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn wrong_type(key: &str, expected: &'static str, v: &Value) -> ConfigError {
    ConfigError::WrongType { key: key.to_string(), expected, found: kind(v) }
}

/// An object; `null` is absent.
pub(super) fn object<'v>(v: &'v Value, key: &str) -> Result<Option<&'v Map<String, Value>>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        other => Err(wrong_type(key, "an object", other)),
    }
}

/// A string; `null` and `""` are absent (Whereabouts treats an empty string as unset).
pub(super) fn string(v: &Value, key: &str) -> Result<Option<String>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(wrong_type(key, "a string", other)),
    }
}

/// An array; `null` and `[]` are absent.
pub(super) fn array<'v>(v: &'v Value, key: &str) -> Result<Option<&'v [Value]>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Array(items) if items.is_empty() => Ok(None),
        Value::Array(items) => Ok(Some(items)),
        other => Err(wrong_type(key, "an array", other)),
    }
}

/// An array of strings (each element must be a string); `null` and `[]` are absent.
pub(super) fn strings(v: &Value, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(items) = array(v, key)? else { return Ok(None) };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(wrong_type(&format!("{key}[{i}]"), "a string", other)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A boolean; `null` is absent.
pub(super) fn boolean(v: &Value, key: &str) -> Result<Option<bool>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(wrong_type(key, "a boolean", other)),
    }
}

/// A non-negative integer; `null` is absent.
pub(super) fn uint(v: &Value, key: &str) -> Result<Option<u64>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_u64().map(Some).ok_or_else(|| wrong_type(key, "a non-negative integer", v)),
        other => Err(wrong_type(key, "a non-negative integer", other)),
    }
}

/// A non-negative integer that fits `u32`.
pub(super) fn uint32(v: &Value, key: &str) -> Result<Option<u32>, ConfigError> {
    match uint(v, key)? {
        None => Ok(None),
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| ConfigError::invalid(key, format!("{n} is larger than {}", u32::MAX))),
    }
}

/// Refuses every key of `map` that is not in `known`, all at once, each with the key probably meant. `hints` maps
/// a normalised unknown key (lower case, no `_`/`-`) to a ready-made hint.
pub(super) fn check_keys(
    map: &Map<String, Value>,
    known: &[&str],
    hints: &[(&str, &str)],
    key_of: impl Fn(&str) -> String,
) -> Result<(), ConfigError> {
    let unknown = unknown_keys(map, known, hints, key_of);
    if unknown.is_empty() { Ok(()) } else { Err(ConfigError::UnknownKeys(unknown)) }
}

fn unknown_keys(
    map: &Map<String, Value>,
    known: &[&str],
    hints: &[(&str, &str)],
    key_of: impl Fn(&str) -> String,
) -> Vec<UnknownKey> {
    map.keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| UnknownKey { key: key_of(k), hint: hint(k, known, hints) })
        .collect()
}

/// What a parser does with a mistake. ADD refuses the config at the first one; DEL and GC must release what ADD
/// took from a config that may be wrong in ways ADD never read (see [`super::release`]), so they note each mistake
/// and read on without the key or entry it is about.
#[derive(Debug, Default)]
pub(super) struct Problems {
    lenient: bool,
    /// The mistakes passed over, as messages naming their key (lenient only).
    pub warnings: Vec<String>,
}

impl Problems {
    /// Every mistake is an error.
    pub(super) fn strict() -> Self {
        Self::default()
    }

    /// Every mistake is a warning.
    pub(super) fn lenient() -> Self {
        Self { lenient: true, warnings: Vec::new() }
    }

    /// Strict: `r` as it is. Lenient: an error is noted and becomes `None`, so the caller carries on without it.
    pub(super) fn pass<T>(&mut self, r: Result<T, ConfigError>) -> Result<Option<T>, ConfigError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if self.lenient => {
                self.warnings.push(e.to_string());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// [`check_keys`]; lenient, each unknown key is noted instead, and the caller reads the `known` keys only.
    pub(super) fn check_keys(
        &mut self,
        map: &Map<String, Value>,
        known: &[&str],
        hints: &[(&str, &str)],
        key_of: impl Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        if !self.lenient {
            return check_keys(map, known, hints, key_of);
        }
        self.warnings.extend(unknown_keys(map, known, hints, key_of).iter().map(ToString::to_string));
        Ok(())
    }
}

fn normalise(s: &str) -> String {
    s.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect()
}

fn hint(unknown: &str, known: &[&str], hints: &[(&str, &str)]) -> Option<String> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(unknown)) {
        return Some(format!("keys are case-sensitive: did you mean {k:?}?"));
    }
    let norm = normalise(unknown);
    if let Some(k) = known.iter().find(|k| normalise(k) == norm) {
        return Some(format!("did you mean {k:?}?"));
    }
    if let Some((_, h)) = hints.iter().find(|(alias, _)| *alias == norm) {
        return Some((*h).to_string());
    }
    // a typo: the closest known key within two edits, for keys long enough that this means something
    if norm.len() < 4 {
        return None;
    }
    known
        .iter()
        .map(|k| (levenshtein(&norm, &normalise(k)), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| format!("did you mean {k:?}?"))
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["range", "range_start", "ipRanges", "enable_overlapping_ranges"];

    #[test]
    fn hints() {
        assert_eq!(hint("rangeStart", KNOWN, &[]).unwrap(), "did you mean \"range_start\"?");
        assert_eq!(hint("Range", KNOWN, &[]).unwrap(), "keys are case-sensitive: did you mean \"range\"?");
        assert_eq!(hint("ip_ranges", KNOWN, &[]).unwrap(), "did you mean \"ipRanges\"?");
        assert_eq!(hint("rnage_start", KNOWN, &[]).unwrap(), "did you mean \"range_start\"?");
        assert_eq!(hint("subnet", KNOWN, &[("subnet", "x")]).unwrap(), "x");
        assert_eq!(hint("foo", KNOWN, &[]), None);
        assert_eq!(hint("completely_different", KNOWN, &[]), None);
    }

    #[test]
    fn levenshtein_distance() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("abc", "abc"), 0);
    }
}
