//! Pure allocation: (range, taken offsets, strategy) -> a free offset. No I/O.
//!
//! The search walks the usable intervals of the range and, inside each, the taken offsets that fall in it, looking
//! for the first gap. Its cost is bounded by the number of usable intervals plus the number of taken entries (times
//! a `BTreeSet` lookup), never by the size of the range: an IPv6 /64 costs what a /24 does.

use std::collections::BTreeSet;

use crate::range::IpRange;

/// How a free address is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// The lowest free usable offset (Whereabouts' choice).
    #[default]
    LowestFree,
    /// The first free usable offset at or after a pseudo-random start, wrapping: spreads concurrent writers.
    Random,
}

/// Picks a usable offset of `range` that is not in `taken`, or `None` when the range is exhausted. `seed` drives
/// [`Strategy::Random`] and is ignored otherwise.
///
/// `taken` may hold offsets that are not usable (outside the bounds, excluded, or not even in the CIDR, as another
/// tool may have written them); they are ignored. With [`Strategy::Random`] the start is the `k`-th usable offset
/// for `k = seed mod usable_count`, so every usable address can be a start; for ranges of more than 2^64 usable
/// addresses that confines starts to the lowest 2^64 of them, which spreads writers just as well and keeps
/// offsets small.
pub fn pick(range: &IpRange, taken: &BTreeSet<u128>, strategy: Strategy, seed: u64) -> Option<u128> {
    match strategy {
        Strategy::LowestFree => first_free(range, taken, 0, u128::MAX),
        Strategy::Random => {
            let count = range.usable_count();
            if count == 0 {
                return None;
            }
            let start = range.nth_usable(u128::from(seed) % count)?;
            first_free(range, taken, start, u128::MAX).or_else(|| match start {
                0 => None,
                _ => first_free(range, taken, 0, start - 1),
            })
        }
    }
}

/// The lowest usable offset in `lo..=hi` that is not taken.
fn first_free(range: &IpRange, taken: &BTreeSet<u128>, lo: u128, hi: u128) -> Option<u128> {
    for interval in range.usable_intervals() {
        if *interval.start() > hi {
            break;
        }
        let (a, b) = ((*interval.start()).max(lo), (*interval.end()).min(hi));
        if a > b {
            continue;
        }
        // `taken` is sorted and unique: the first entry that is not the next candidate leaves a gap before it.
        let mut candidate = a;
        let mut full = false;
        for &t in taken.range(a..=b) {
            if t != candidate {
                break;
            }
            if candidate == b {
                full = true;
                break;
            }
            candidate += 1;
        }
        if !full {
            return Some(candidate);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as Gen;
    use std::net::IpAddr;

    fn ex(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn set(v: &[u128]) -> BTreeSet<u128> {
        v.iter().copied().collect()
    }

    #[test]
    fn lowest_free_basics() {
        let r = IpRange::parse("10.0.0.0/29", None, None, &[]).unwrap();
        assert_eq!(pick(&r, &set(&[]), Strategy::LowestFree, 0), Some(1));
        assert_eq!(pick(&r, &set(&[1, 2, 4]), Strategy::LowestFree, 0), Some(3));
        assert_eq!(pick(&r, &set(&[0, 1, 2, 3, 4, 5]), Strategy::LowestFree, 0), Some(6));
        assert_eq!(pick(&r, &set(&[1, 2, 3, 4, 5, 6]), Strategy::LowestFree, 0), None);
        // Unusable entries (network, broadcast, outside the CIDR) are ignored.
        assert_eq!(pick(&r, &set(&[0, 7, 8, 1000, u128::MAX]), Strategy::LowestFree, 0), Some(1));
    }

    #[test]
    fn skips_excludes_and_gateway() {
        let mut r = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.0/28", "10.0.0.17"])).unwrap();
        r.exclude_addr("10.0.0.16".parse::<IpAddr>().unwrap());
        assert_eq!(pick(&r, &set(&[]), Strategy::LowestFree, 0), Some(18));
        assert_eq!(pick(&r, &set(&[18, 19]), Strategy::LowestFree, 0), Some(20));
    }

    #[test]
    fn random_wraps_around() {
        let r = IpRange::parse("10.0.0.0/29", None, None, &[]).unwrap();
        // usable 1..=6; seed 4 -> start at the 5th usable address, offset 5.
        assert_eq!(pick(&r, &set(&[]), Strategy::Random, 4), Some(5));
        assert_eq!(pick(&r, &set(&[5, 6]), Strategy::Random, 4), Some(1));
        assert_eq!(pick(&r, &set(&[1, 5, 6]), Strategy::Random, 4), Some(2));
        assert_eq!(pick(&r, &set(&[1, 2, 3, 4, 5, 6]), Strategy::Random, 4), None);
        let empty = IpRange::parse("10.0.0.0/29", None, None, &ex(&["10.0.0.0/29"])).unwrap();
        assert_eq!(pick(&empty, &set(&[]), Strategy::Random, 4), None);
        assert_eq!(pick(&empty, &set(&[]), Strategy::LowestFree, 4), None);
    }

    #[test]
    fn huge_ipv6_range_with_a_crowded_bottom_picks_fast() {
        for range in ["2001:db8::/64", "2001:db8::/32", "fd00::/8"] {
            let r = IpRange::parse(range, None, None, &ex(&["2001:db8::1:0/112", "fd00::1:0/112"])).unwrap();
            let mut taken: BTreeSet<u128> = (1..=20_000u128).collect();
            taken.extend((0x1_0000..0x2_0000u128).step_by(7));
            taken.insert(r.broadcast_offset() - 1);
            let low = pick(&r, &taken, Strategy::LowestFree, 0).unwrap();
            assert_eq!(low, 20_001);
            for seed in [0, 1, 19_999, u64::MAX, 0x1234_5678_9abc_def0] {
                let o = pick(&r, &taken, Strategy::Random, seed).unwrap();
                assert!(r.is_usable(o) && !taken.contains(&o), "{range} seed {seed}: {o}");
            }
        }
    }

    #[test]
    fn huge_range_nearly_full_of_excludes() {
        // A /64 where only a handful of addresses at the very top are not excluded, and all but one are taken.
        let r =
            IpRange::parse("2001:db8::/64", None, None, &ex(&["2001:db8::/65", "2001:db8::8000:0:0:0/66"])).unwrap();
        let first = r.first_usable().unwrap();
        assert_eq!(first, 3 << 62);
        let taken: BTreeSet<u128> = (first..first + 5000).collect();
        assert_eq!(pick(&r, &taken, Strategy::LowestFree, 0), Some(first + 5000));
        assert_eq!(pick(&r, &taken, Strategy::Random, 3), Some(first + 5000));
    }

    /// A small range with excludes, a gateway and start/end bounds, described by proptest.
    fn arb_range() -> impl Gen<Value = (IpRange, u128)> {
        (
            0u32..40,
            0u32..40,
            proptest::collection::vec((0u32..64, 28u8..=32), 0..4),
            proptest::option::of(0u32..64),
            any::<bool>(),
        )
            .prop_map(|(start, len, excludes, gateway, v6)| {
                let end = (start + len).min(63);
                let (range, s, e, excludes, gateway) = if v6 {
                    (
                        "fd00::/122".to_string(),
                        format!("fd00::{start:x}"),
                        format!("fd00::{end:x}"),
                        excludes.iter().map(|(o, p)| format!("fd00::{o:x}/{}", p + 96)).collect::<Vec<_>>(),
                        gateway.map(|g| format!("fd00::{g:x}")),
                    )
                } else {
                    (
                        "10.0.0.0/26".to_string(),
                        format!("10.0.0.{start}"),
                        format!("10.0.0.{end}"),
                        excludes.iter().map(|(o, p)| format!("10.0.0.{o}/{p}")).collect::<Vec<_>>(),
                        gateway.map(|g| format!("10.0.0.{g}")),
                    )
                };
                let mut r = IpRange::parse(&range, Some(&s), Some(&e), &excludes).unwrap();
                if let Some(g) = gateway {
                    r.exclude_addr(g.parse().unwrap());
                }
                (r, 64)
            })
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { random: bool, seed: u64 },
        Release(usize),
    }

    fn arb_op() -> impl Gen<Value = Op> {
        prop_oneof![
            3 => (any::<bool>(), any::<u64>()).prop_map(|(random, seed)| Op::Alloc { random, seed }),
            1 => any::<usize>().prop_map(Op::Release),
        ]
    }

    proptest! {
        #[test]
        fn allocate_and_release_never_hands_out_twice(
            (r, size) in arb_range(),
            ops in proptest::collection::vec(arb_op(), 1..200),
            foreign in proptest::collection::btree_set(0u128..200, 0..10),
        ) {
            let usable: BTreeSet<u128> = (0..size).filter(|&o| r.is_usable(o)).collect();
            prop_assert_eq!(usable.len() as u128, r.usable_count());
            // Offsets another tool wrote, usable or not: they count as taken, and are never released by us.
            let mut taken = foreign.clone();
            let mut ours: Vec<u128> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { random, seed } => {
                        let strategy = if random { Strategy::Random } else { Strategy::LowestFree };
                        let free: BTreeSet<u128> = usable.difference(&taken).copied().collect();
                        match pick(&r, &taken, strategy, seed) {
                            Some(o) => {
                                prop_assert!(usable.contains(&o), "unusable offset {}", o);
                                prop_assert!(!taken.contains(&o), "offset {} handed out twice", o);
                                if !random {
                                    prop_assert_eq!(Some(&o), free.first());
                                }
                                taken.insert(o);
                                ours.push(o);
                            }
                            None => prop_assert!(free.is_empty(), "none while {:?} are free", free),
                        }
                    }
                    Op::Release(i) if !ours.is_empty() => {
                        let o = ours.swap_remove(i % ours.len());
                        taken.remove(&o);
                    }
                    Op::Release(_) => {}
                }
            }
        }

        #[test]
        fn random_start_is_the_seeded_usable_address((r, _) in arb_range(), seed in any::<u64>()) {
            // With nothing taken, Random returns exactly the k-th usable address.
            let expected = if r.usable_count() == 0 { None } else { r.nth_usable(u128::from(seed) % r.usable_count()) };
            prop_assert_eq!(pick(&r, &BTreeSet::new(), Strategy::Random, seed), expected);
        }

        #[test]
        fn exhausted_exactly_when_all_usable_are_taken((r, size) in arb_range(), seed in any::<u64>()) {
            let mut taken: BTreeSet<u128> = (0..size).filter(|&o| r.is_usable(o)).collect();
            prop_assert_eq!(pick(&r, &taken, Strategy::LowestFree, seed), None);
            prop_assert_eq!(pick(&r, &taken, Strategy::Random, seed), None);
            if let Some(&o) = taken.iter().nth((seed as usize) % taken.len().max(1)) {
                taken.remove(&o);
                prop_assert_eq!(pick(&r, &taken, Strategy::LowestFree, seed), Some(o));
                prop_assert_eq!(pick(&r, &taken, Strategy::Random, seed), Some(o));
            }
        }

        #[test]
        fn random_stays_within_usable_on_wide_ranges(
            prefix in 0u8..=120, raw in any::<u128>(), seed in any::<u64>(),
            taken in proptest::collection::btree_set(any::<u64>(), 0..50)
        ) {
            let cidr = ipnet::IpNet::new(IpAddr::V6(std::net::Ipv6Addr::from(0x2001_0db8u128 << 96)), prefix)
                .unwrap()
                .trunc();
            let top = u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
            // The lowest quarter excluded, so that the usable set does not start at offset 1.
            let exclude = format!("{}/{}", cidr.network(), prefix + 2);
            let r = IpRange::parse(&cidr.to_string(), None, None, &[exclude]).unwrap();
            let taken: BTreeSet<u128> = taken.iter().map(|&t| u128::from(t) % top).chain([raw % top]).collect();
            let o = pick(&r, &taken, Strategy::Random, seed).unwrap();
            prop_assert!(r.is_usable(o));
            prop_assert!(!taken.contains(&o));
        }
    }
}
