//! How a range is cut into node slices: the slice size a config names, and the slices of a range (Whereabouts'
//! `DivideRangeBySize`). Pure; the config checks with it, and the slice mode cuts with it.

use ipnet::IpNet;

/// The most slices one range may be cut into: the NodeSlicePool lists them all in one object (~70 bytes each),
/// which must stay well below etcd's request limit.
pub const MAX_SLICES: u128 = 8192;

/// Why a range cannot be cut as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// The slice prefix is shorter than the range's, or longer than an address.
    #[error("/{prefix} cannot slice {range}: a slice is /{} to /{}", range.prefix_len(), range.max_prefix_len())]
    BadPrefix { range: IpNet, prefix: u8 },
    /// Too many slices for one NodeSlicePool object.
    #[error("/{prefix} cuts {range} into {count} slices; at most {MAX_SLICES} fit one NodeSlicePool")]
    TooMany { range: IpNet, prefix: u8, count: u128 },
}

/// The slices of `range` of prefix length `prefix`, lowest first (Whereabouts' `DivideRangeBySize`, for IPv6
/// too).
pub fn divide(range: IpNet, prefix: u8) -> Result<Vec<IpNet>, SliceError> {
    let range = range.trunc();
    if prefix < range.prefix_len() || prefix > range.max_prefix_len() {
        return Err(SliceError::BadPrefix { range, prefix });
    }
    let count = count(range, prefix);
    if count > MAX_SLICES {
        return Err(SliceError::TooMany { range, prefix, count });
    }
    Ok(range.subnets(prefix).expect("prefix checked above").collect())
}

/// A `node_slice_size` or `sliceSize` as a prefix length: `/26` or `26` (Whereabouts' `DivideRangeBySize`).
pub fn parse_slice_size(s: &str) -> Option<u8> {
    let digits = s.strip_prefix('/').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u8>().ok().filter(|p| *p <= 128)
}

/// A `node_slice_size` as the config spells it (`/26` or `26`) and the prefix length it means: read once, written
/// as spelled (Whereabouts' controller compares `spec.sliceSize` with its config's string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSize {
    prefix: u8,
    spelled: String,
}

impl SliceSize {
    /// `s`, if it is a prefix length: `/26` or `26`.
    pub fn parse(s: &str) -> Option<Self> {
        parse_slice_size(s).map(|prefix| Self { prefix, spelled: s.to_string() })
    }

    /// The prefix length of a slice.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// As the config spells it.
    pub fn as_str(&self) -> &str {
        &self.spelled
    }
}

impl std::fmt::Display for SliceSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelled)
    }
}

/// Whether two CIDRs share an address (aligned blocks: one holds the other, or they are apart).
pub fn overlap(a: IpNet, b: IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// How many slices of `prefix` `range` holds (saturating: only compared with [`MAX_SLICES`]).
fn count(range: IpNet, prefix: u8) -> u128 {
    1u128.checked_shl(u32::from(prefix - range.prefix_len())).unwrap_or(u128::MAX)
}
