//! Ways to break a config: edits of its JSON tree (a key dropped or misspelt, a value of the wrong type or out
//! of range, a malformed address, a conflicting key added, a range duplicated) and of its bytes (truncated, not
//! an object, random bytes, a byte flipped, a key repeated).
//!
//! An edit picks its target with an [`Index`] into the list of candidate nodes, so it applies to whatever config
//! it meets, and a list of edits shrinks towards the one that matters.

use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Map, Value, json};

use super::config::re;

/// One step of a path into a JSON tree.
#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    At(usize),
}

/// How a key is misspelt.
#[derive(Debug, Clone, Copy)]
pub enum KeyStyle {
    Camel,
    Capitalised,
    Upper,
    Kebab,
    TrailingSpace,
    Typo,
    /// Replaced by a key another plugin or an older version uses (`subnet`, `ranges`, `gw`...).
    Alias(&'static str),
}

/// One edit of the JSON tree.
#[derive(Debug, Clone)]
pub enum Mutation {
    Drop(Index),
    Rename(Index, KeyStyle),
    Replace(Index, Value),
    Corrupt(Index, &'static str),
    Insert(Index, &'static str, Value),
    Version(Value),
    DuplicateRange,
    SwapBounds,
}

/// What becomes of the tree's bytes.
#[derive(Debug, Clone)]
pub enum Shape {
    Json { pretty: bool },
    Truncate(Index),
    NotObject(Value),
    Bytes(Vec<u8>),
    Flip(Index, u8),
    DuplicateKey(&'static str, Value),
}

/// Addresses and ranges that are malformed, of the wrong size or family, or valid but outside every range.
const BAD_ADDRESSES: &[&str] = &[
    "198.18.0.256",
    "198.18.0",
    "198.18.0.1/33",
    "198.18.0.1/",
    "/24",
    "198.18.000.1",
    "198.18.0.0/024",
    "0.0.0.0/0",
    "::/0",
    "255.255.255.255/32",
    "198.18.0.5-198.18.0.1/24",
    "198.18.0.1-2001:db8::5/64",
    "10.0.0.1-198.18.0.5/24",
    "198.18.0.0/31",
    "198.18.0.0/32",
    "2001:db8::/127",
    "2001:db8::/129",
    "2001:db8:::1",
    "::ffff:198.18.0.0/120",
    "fe80::1%eth0",
    " 198.18.0.1",
    "198.18.0.1 ",
    "203.0.113.7",
    "2001:db9::1",
    "198.18.0.0/16",
    "2001:db8::/32",
    "198.18.0.1-",
    "-198.18.0.1/24",
    "１９８.18.0.1",
];

/// Keys (known, unknown, misspelt, hinted) and values an edit adds to an object.
const INSERTED_KEYS: &[&str] = &[
    "range",
    "range_start",
    "range_end",
    "exclude",
    "gateway",
    "rangeStart",
    "subnet",
    "ips",
    "Range",
    "foo",
    "configuration_path",
    "log_file",
    "timeout_seconds",
    "node_slice_size",
    "network_name",
    "allocation_strategy",
    "kubeconfig",
    "",
];

const ALIASES: &[&str] = &["subnet", "ranges", "kubeconfig", "gw", "ips", "strategy", "timeout", "omitRanges"];

/// Values of the wrong type, out of range, empty, odd unicode, huge, or nested deeper than the parser goes.
pub fn junk() -> impl Strategy<Value = Value> {
    let fixed = select(
        &[
            "null",
            "true",
            "false",
            "0",
            "-1",
            "1.5",
            "1e308",
            "18446744073709551616",
            "4294967296",
            "181",
            "256",
            "\"\"",
            "\" \"",
            "\"\\u0000\"",
            "\"\\u202e198.18.0.1\"",
            "\"/nonexistent/hereabouts-parse-fuzz/flat.conf\"",
            "\"relative/path\"",
            "\"random\"",
            "\"highest\"",
            "\"/26\"",
            "\"/129\"",
            "\"26 \"",
            "[]",
            "{}",
            "[\"198.18.0.1\", 7]",
            "[[\"a\"]]",
            "{\"range\": 5}",
            "{\"kubeconfig\": \"relative\"}",
            "[{\"containerID\": 1, \"ifname\": \"eth0\"}]",
            "[[\"sandbox-0\", \"eth0\"]]",
            "\"sandbox-0\"",
        ][..],
    )
    .prop_map(|s| serde_json::from_str::<Value>(s).expect("fixed junk is JSON"));
    prop_oneof![
        6 => fixed,
        2 => select(BAD_ADDRESSES).prop_map(|s| json!(s)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => re("\\PC{0,12}").prop_map(|s| json!(s)),
        1 => (1usize..4000).prop_map(|n| json!("a".repeat(n))),
        1 => (1usize..300).prop_map(nested),
    ]
}

/// An array nested `depth` deep: past 128 serde_json refuses it (its recursion limit).
fn nested(depth: usize) -> Value {
    let mut v = json!("deep");
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let style = prop_oneof![
        Just(KeyStyle::Camel),
        Just(KeyStyle::Capitalised),
        Just(KeyStyle::Upper),
        Just(KeyStyle::Kebab),
        Just(KeyStyle::TrailingSpace),
        Just(KeyStyle::Typo),
        select(ALIASES).prop_map(KeyStyle::Alias),
    ];
    let version = prop_oneof![
        select(&["0.1.0", "0.2.0", "1.2.0", "2.0.0", "", "0.3.1 ", "v1.0.0", "1.0.0\u{0}"][..]).prop_map(|s| json!(s)),
        Just(json!(1.0)),
        Just(Value::Null),
    ];
    prop_oneof![
        3 => any::<Index>().prop_map(Mutation::Drop),
        3 => (any::<Index>(), style).prop_map(|(i, s)| Mutation::Rename(i, s)),
        3 => (any::<Index>(), junk()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        3 => (any::<Index>(), select(BAD_ADDRESSES)).prop_map(|(i, s)| Mutation::Corrupt(i, s)),
        2 => (any::<Index>(), select(INSERTED_KEYS), prop_oneof![select(BAD_ADDRESSES).prop_map(|s| json!(s)), junk()])
            .prop_map(|(i, k, v)| Mutation::Insert(i, k, v)),
        1 => version.prop_map(Mutation::Version),
        1 => Just(Mutation::DuplicateRange),
        1 => Just(Mutation::SwapBounds),
    ]
}

pub fn shape() -> impl Strategy<Value = Shape> {
    let not_object = prop_oneof![
        Just(json!([])),
        Just(json!("netconf")),
        Just(json!(42)),
        Just(Value::Null),
        Just(json!([{"cniVersion": "1.0.0"}])),
    ];
    let dup_key = select(&["cniVersion", "name", "ipam", "runtimeConfig", "cni.dev/valid-attachments"][..]);
    prop_oneof![
        60 => any::<bool>().prop_map(|pretty| Shape::Json { pretty }),
        2 => any::<Index>().prop_map(Shape::Truncate),
        1 => not_object.prop_map(Shape::NotObject),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Shape::Bytes),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Shape::Flip(i, b)),
        1 => (dup_key, junk()).prop_map(|(k, v)| Shape::DuplicateKey(k, v)),
    ]
}

/// Every node of `v` (depth first, the root first), with its path.
fn nodes(v: &Value) -> Vec<(Vec<Seg>, &Value)> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), v)];
    while let Some((path, v)) = stack.pop() {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter().rev() {
                    let mut p = path.clone();
                    p.push(Seg::Key(k.clone()));
                    stack.push((p, child));
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate().rev() {
                    let mut p = path.clone();
                    p.push(Seg::At(i));
                    stack.push((p, child));
                }
            }
            _ => {}
        }
        out.push((path, v));
    }
    out
}

fn get_mut<'v>(v: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    path.iter().try_fold(v, |v, seg| match seg {
        Seg::Key(k) => v.as_object_mut()?.get_mut(k),
        Seg::At(i) => v.as_array_mut()?.get_mut(*i),
    })
}

/// The path of a node picked by `i` among those `keep` selects.
fn pick(v: &Value, i: &Index, keep: impl Fn(&[Seg], &Value) -> bool) -> Option<Vec<Seg>> {
    let candidates: Vec<Vec<Seg>> = nodes(v).into_iter().filter(|(p, n)| keep(p, n)).map(|(p, _)| p).collect();
    (!candidates.is_empty()).then(|| candidates[i.index(candidates.len())].clone())
}

fn respell(key: &str, style: KeyStyle) -> String {
    let out = match style {
        KeyStyle::Camel => {
            let mut out = String::new();
            let mut upper = false;
            for c in key.chars() {
                if c == '_' {
                    upper = true;
                } else if upper {
                    out.extend(c.to_uppercase());
                    upper = false;
                } else {
                    out.push(c);
                }
            }
            out
        }
        KeyStyle::Capitalised => {
            let mut chars = key.chars();
            chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
        }
        KeyStyle::Upper => key.to_uppercase(),
        KeyStyle::Kebab => key.replace('_', "-"),
        KeyStyle::TrailingSpace => format!("{key} "),
        KeyStyle::Typo => {
            let mut chars: Vec<char> = key.chars().collect();
            if chars.len() >= 2 {
                chars.swap(0, 1);
            }
            chars.into_iter().collect()
        }
        KeyStyle::Alias(a) => a.to_string(),
    };
    if out == key { format!("{key}_") } else { out }
}

/// The `ipam` object, if stdin still has one.
fn ipam(v: &mut Value) -> Option<&mut Map<String, Value>> {
    v.get_mut("ipam")?.as_object_mut()
}

impl Mutation {
    pub fn apply(&self, v: &mut Value) {
        let is_member = |p: &[Seg], _: &Value| matches!(p.last(), Some(Seg::Key(_)));
        match self {
            Mutation::Drop(i) => {
                if let Some(mut path) = pick(v, i, is_member)
                    && let Some(Seg::Key(k)) = path.pop()
                    && let Some(Value::Object(m)) = get_mut(v, &path)
                {
                    m.remove(&k);
                }
            }
            Mutation::Rename(i, style) => {
                if let Some(mut path) = pick(v, i, is_member)
                    && let Some(Seg::Key(k)) = path.pop()
                    && let Some(Value::Object(m)) = get_mut(v, &path)
                    && let Some(val) = m.remove(&k)
                {
                    m.insert(respell(&k, *style), val);
                }
            }
            Mutation::Replace(i, junk) => {
                if let Some(path) = pick(v, i, |p, _| !p.is_empty())
                    && let Some(node) = get_mut(v, &path)
                {
                    *node = junk.clone();
                }
            }
            Mutation::Corrupt(i, bad) => {
                let addressy =
                    |_: &[Seg], n: &Value| n.as_str().is_some_and(|s| s.contains(['.', ':']) && s.contains('/'));
                let target = pick(v, i, addressy).or_else(|| pick(v, i, |_, n| n.is_string()));
                if let Some(path) = target
                    && let Some(node) = get_mut(v, &path)
                {
                    *node = json!(bad);
                }
            }
            Mutation::Insert(i, key, value) => {
                if let Some(path) = pick(v, i, |_, n| n.is_object())
                    && let Some(Value::Object(m)) = get_mut(v, &path)
                {
                    m.insert((*key).to_string(), value.clone());
                }
            }
            Mutation::Version(version) => {
                if let Some(m) = v.as_object_mut() {
                    m.insert("cniVersion".into(), version.clone());
                }
            }
            Mutation::DuplicateRange => {
                if let Some(ipam) = ipam(v) {
                    let first = match ipam.get("range") {
                        Some(r) => Some(json!({"range": r})),
                        None => ipam.get("ipRanges").and_then(|l| l.get(0)).cloned(),
                    };
                    if let Some(first) = first {
                        match ipam.get_mut("ipRanges").and_then(Value::as_array_mut) {
                            Some(list) => list.push(first),
                            None => {
                                ipam.insert("ipRanges".into(), json!([first]));
                            }
                        }
                    }
                }
            }
            Mutation::SwapBounds => {
                if let Some(ipam) = ipam(v) {
                    swap_bounds(ipam);
                    if let Some(Value::Object(first)) = ipam.get_mut("ipRanges").and_then(|l| l.get_mut(0)) {
                        swap_bounds(first);
                    }
                }
            }
        }
    }
}

/// Points `ipam.configuration_path`, when an edit set it to an absolute path, at `missing`: the loader would read
/// any file that exists, and what the test means by the path is "a flat file that is not there".
pub fn keep_flat_file_missing(v: &mut Value, missing: &str) {
    if let Some(ipam) = ipam(v)
        && let Some(Value::String(path)) = ipam.get_mut("configuration_path")
        && path.starts_with('/')
    {
        *path = missing.to_string();
    }
}

/// Swaps `range_start` and `range_end` of a range object that has both: the end then lies before the start.
fn swap_bounds(range: &mut Map<String, Value>) {
    if range.contains_key("range_start")
        && let Some(end) = range.remove("range_end")
        && let Some(start) = range.insert("range_start".into(), end)
    {
        range.insert("range_end".into(), start);
    }
}

impl Shape {
    /// The bytes of `v` in this shape.
    pub fn render(&self, v: &Value) -> Vec<u8> {
        let text = |pretty: bool| {
            if pretty { serde_json::to_vec_pretty(v) } else { serde_json::to_vec(v) }.expect("a Value serialises")
        };
        match self {
            Shape::Json { pretty } => text(*pretty),
            Shape::Truncate(i) => {
                let mut bytes = text(false);
                bytes.truncate(i.index(bytes.len().max(1)));
                bytes
            }
            Shape::NotObject(other) => serde_json::to_vec(other).expect("a Value serialises"),
            Shape::Bytes(bytes) => bytes.clone(),
            Shape::Flip(i, b) => {
                let mut bytes = text(false);
                if !bytes.is_empty() {
                    let at = i.index(bytes.len());
                    bytes[at] ^= b.max(&1);
                }
                bytes
            }
            Shape::DuplicateKey(key, value) => {
                // serde_json keeps the last of two equal keys: the repeat, put last, overrides the original
                let mut bytes = text(false);
                if bytes.last() == Some(&b'}') {
                    bytes.pop();
                    let sep = if bytes.len() > 1 { "," } else { "" };
                    let repeat = format!("{sep}{}:{}}}", json!(key), value);
                    bytes.extend_from_slice(repeat.as_bytes());
                }
                bytes
            }
        }
    }

    /// Whether the bytes are the tree as it is.
    pub fn is_faithful(&self) -> bool {
        matches!(self, Shape::Json { .. })
    }
}
