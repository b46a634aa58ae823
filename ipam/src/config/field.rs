//! Where each value of a config comes from (the inline `ipam` object or the flat file), so that a message about a
//! merged config names the right place.

use std::path::Path;

/// Where a value comes from: the `ipam` object on stdin or the flat file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin<'p> {
    Inline,
    FlatFile(&'p Path),
}

impl Origin<'_> {
    /// The name of `key` (a path below the `ipam` object, e.g. `ipRanges[1].range_start`) in messages.
    pub(super) fn key(self, key: &str) -> String {
        match self {
            Origin::Inline => format!("ipam.{key}"),
            Origin::FlatFile(path) => format!("{key} (flat file {})", path.display()),
        }
    }
}

/// A value with its origin, so that a message about a merged config still names the right place.
#[derive(Debug, Clone)]
pub(super) struct Sourced<'p, T> {
    pub value: T,
    pub origin: Origin<'p>,
}

pub(super) type Field<'p, T> = Option<Sourced<'p, T>>;

/// `value`, if any, from `origin`.
pub(super) fn sourced<T>(origin: Origin<'_>, value: Option<T>) -> Field<'_, T> {
    value.map(|value| Sourced { value, origin })
}
