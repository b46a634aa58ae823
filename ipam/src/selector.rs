//! Kubernetes label selectors in their string form (`kubectl get -l`), for `ipRanges[].node_selector`: which
//! nodes a range serves.
//!
//! The grammar is `k8s.io/apimachinery/pkg/labels.Parse`: requirements separated by commas, each `key`, `!key`,
//! `key=value`, `key==value`, `key!=value`, `key in (v1,v2)` or `key notin (v1,v2)`. As there, `!=` and `notin`
//! match a node without the label, and every requirement must hold.
//!
//! ```
//! use std::collections::BTreeMap;
//! use hereabouts_ipam::selector::LabelSelector;
//!
//! let s = LabelSelector::parse("topology.kubernetes.io/zone in (a, b), !example.com/drained").unwrap();
//! let labels = BTreeMap::from([("topology.kubernetes.io/zone".to_string(), "b".to_string())]);
//! assert!(s.matches(&labels));
//! assert!(!s.matches(&BTreeMap::new()));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A parsed selector; displays as it was written, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    Absent(String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

impl LabelSelector {
    /// Parses `text`; `Err` says what is wrong and where. An empty selector is refused: it would select every node,
    /// which leaving the key out says better.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        let mut rest = text.trim();
        if rest.is_empty() {
            return Err("empty: it would select every node; leave the key out instead".into());
        }
        while !rest.is_empty() {
            let (req, after) = requirement(rest)?;
            requirements.push(req);
            rest = after.trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after.trim_start();
                if rest.is_empty() {
                    return Err("a trailing comma".into());
                }
            } else if !rest.is_empty() {
                return Err(format!("expected a comma before {rest:?}"));
            }
        }
        Ok(Self { requirements })
    }

    /// Whether a node with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &BTreeSet<String>| v.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Exists(k) => k.clone(),
                Requirement::Absent(k) => format!("!{k}"),
                Requirement::In(k, v) if v.len() == 1 => format!("{k}={}", set(v)),
                Requirement::In(k, v) => format!("{k} in ({})", set(v)),
                Requirement::NotIn(k, v) if v.len() == 1 => format!("{k}!={}", set(v)),
                Requirement::NotIn(k, v) => format!("{k} notin ({})", set(v)),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// One requirement at the start of `s`, and what follows it.
fn requirement(s: &str) -> Result<(Requirement, &str), String> {
    if let Some(after) = s.strip_prefix('!') {
        let (k, rest) = key(after.trim_start())?;
        return Ok((Requirement::Absent(k), rest));
    }
    let (k, rest) = key(s)?;
    let trimmed = rest.trim_start();
    if let Some(after) = trimmed.strip_prefix("!=") {
        let (v, rest) = value(after)?;
        return Ok((Requirement::NotIn(k, BTreeSet::from([v])), rest));
    }
    if let Some(after) = trimmed.strip_prefix("==").or_else(|| trimmed.strip_prefix('=')) {
        let (v, rest) = value(after)?;
        return Ok((Requirement::In(k, BTreeSet::from([v])), rest));
    }
    // `in`/`notin` need the space that separates them from the key
    if rest.len() > trimmed.len() {
        for (word, negated) in [("notin", true), ("in", false)] {
            if let Some(after) = trimmed.strip_prefix(word)
                && after.trim_start().starts_with('(')
            {
                let (values, rest) = set(after.trim_start())?;
                let req = if negated { Requirement::NotIn(k, values) } else { Requirement::In(k, values) };
                return Ok((req, rest));
            }
        }
    }
    if trimmed.is_empty() || trimmed.starts_with(',') {
        return Ok((Requirement::Exists(k), rest));
    }
    Err(format!("after the key {k:?}: expected =, ==, !=, in (...), notin (...) or a comma, found {trimmed:?}"))
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn key(s: &str) -> Result<(String, &str), String> {
    let end = s.find(|c: char| !is_key_char(c)).unwrap_or(s.len());
    let k = &s[..end];
    if k.is_empty() {
        return Err(format!("expected a label key at {s:?}"));
    }
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || p.contains('/')
            || !p.split('.').all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')))
    {
        return Err(format!("{k:?}: the prefix before / must be a DNS subdomain"));
    }
    if !is_name(name) {
        return Err(format!(
            "{k:?}: the name must be 1 to 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        ));
    }
    Ok((k.to_string(), &s[end..]))
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A label value (possibly empty) after an operator.
fn value(s: &str) -> Result<(String, &str), String> {
    let s = s.trim_start();
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).unwrap_or(s.len());
    let v = &s[..end];
    if !v.is_empty() && !is_name(v) {
        return Err(format!("{v:?} is not a label value"));
    }
    Ok((v.to_string(), &s[end..]))
}

/// `(v1, v2)`.
fn set(s: &str) -> Result<(BTreeSet<String>, &str), String> {
    let inner_start = &s[1..];
    let close = inner_start.find(')').ok_or_else(|| format!("{s:?}: no closing parenthesis"))?;
    let mut values = BTreeSet::new();
    for part in inner_start[..close].split(',') {
        let (v, rest) = value(part)?;
        if !rest.trim().is_empty() {
            return Err(format!("{part:?} is not a label value"));
        }
        values.insert(v);
    }
    Ok((values, &inner_start[close + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_matches_as_in_kubernetes() {
        let node = labels(&[("zone", "a"), ("example.com/role", "edge"), ("gpu", "")]);
        let cases = [
            ("zone", true),
            ("!zone", false),
            ("!other", true),
            ("zone=a", true),
            ("zone==a", true),
            ("zone=b", false),
            ("zone!=b", true),
            ("other!=b", true),
            ("zone in (a,b)", true),
            ("zone in (b, c)", false),
            ("zone notin (b,c)", true),
            ("other notin (b)", true),
            ("other in (b)", false),
            ("zone=a, example.com/role=edge", true),
            ("zone=a,example.com/role=core", false),
            ("gpu=", true),
            ("gpu", true),
        ];
        for (text, want) in cases {
            let s = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.matches(&node), want, "{text}");
        }
    }

    #[test]
    fn mistakes_are_refused_with_a_reason() {
        for text in
            ["", " ", "zone=a,", "=a", "zone in a", "zone in (a", "zone=a b", "-zone", "zone=a$", "a/b/c=d", "/x=y"]
        {
            assert!(LabelSelector::parse(text).is_err(), "{text:?} parsed");
        }
        let long = format!("{}=a", "k".repeat(64));
        assert!(LabelSelector::parse(&long).unwrap_err().contains("63"));
    }

    #[test]
    fn displays_normalised() {
        let s = LabelSelector::parse(" zone in ( b ,a ) , !x,y==1 ,z!=2").unwrap();
        assert_eq!(s.to_string(), "zone in (a,b),!x,y=1,z!=2");
        assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
    }
}
