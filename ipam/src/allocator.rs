//! Pure allocation: (range, taken offsets, strategy) -> a free offset. No I/O.
//!
//! The search walks the usable intervals of the range and, inside each, the taken offsets that fall in it, looking
//! for the first gap. Its cost is bounded by the number of usable intervals plus the number of taken entries (times
//! a `BTreeSet` lookup), never by the size of the range: an IPv6 /64 costs what a /24 does.

use std::collections::BTreeSet;

use crate::range::IpRange;

/// The largest offset an entry may have. Whereabouts reads pool keys as signed 64-bit integers and drops, on its
/// next write of the pool, an entry it cannot read: an address at a larger offset would be freed behind the back
/// of the pod holding it. So no offset above this is handed out, in ranges of any size, unless a network opts out
/// with `large_offsets` ([`IpRange::max_offset`]).
pub const MAX_OFFSET: u128 = i64::MAX as u128;

/// How a free address is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// The lowest free usable offset (Whereabouts' choice).
    #[default]
    LowestFree,
    /// The first free usable offset at or after a pseudo-random start, wrapping: spreads concurrent writers.
    Random,
}

/// Picks a usable offset of `range`, at most [`MAX_OFFSET`], that is not in `taken`, or `None` when there is none.
/// `seed` drives [`Strategy::Random`] and is ignored otherwise.
///
/// `taken` may hold offsets that are not usable (outside the bounds, excluded, or not even in the CIDR, as another
/// tool may have written them); they are ignored. With [`Strategy::Random`] the start is the `k`-th usable offset
/// for `k = seed mod n`, `n` the number of usable offsets up to [`MAX_OFFSET`], so every such address can be a
/// start.
pub fn pick(range: &IpRange, taken: &BTreeSet<u128>, strategy: Strategy, seed: u64) -> Option<u128> {
    match strategy {
        Strategy::LowestFree => free_offsets(range, taken, 0, range.max_offset(), 1).first().copied(),
        Strategy::Random => {
            let count = usable_up_to_max(range);
            if count == 0 {
                return None;
            }
            let start = range.nth_usable(u128::from(seed) % count)?;
            let wrap = || match start {
                0 => None,
                _ => free_offsets(range, taken, 0, start - 1, 1).first().copied(),
            };
            free_offsets(range, taken, start, range.max_offset(), 1).first().copied().or_else(wrap)
        }
    }
}

/// Picks one of the `window` lowest free usable offsets (at most [`MAX_OFFSET`]), chosen by `seed`. Writers that
/// just lost a race for the lowest free address would all race again for the next one; this spreads them over
/// the next few without leaving the bottom of the range.
pub fn pick_near_lowest(range: &IpRange, taken: &BTreeSet<u128>, window: usize, seed: u64) -> Option<u128> {
    let free = free_offsets(range, taken, 0, range.max_offset(), window.max(1));
    (!free.is_empty()).then(|| free[(seed % free.len() as u64) as usize])
}

/// How many usable offsets lie at or below [`MAX_OFFSET`]: how many addresses the range can hand out.
pub fn usable_up_to_max(range: &IpRange) -> u128 {
    range
        .usable_intervals()
        .take_while(|r| *r.start() <= range.max_offset())
        .map(|r| (*r.end()).min(range.max_offset()) - r.start() + 1)
        .sum()
}

/// Up to `limit` usable offsets in `lo..=hi` that are not taken, lowest first. The cost is bounded by the usable
/// intervals, the taken entries below the last one found, and `limit`.
fn free_offsets(range: &IpRange, taken: &BTreeSet<u128>, lo: u128, hi: u128, limit: usize) -> Vec<u128> {
    let mut found = Vec::with_capacity(limit.min(64));
    for interval in range.usable_intervals() {
        if *interval.start() > hi || found.len() >= limit {
            break;
        }
        let (a, b) = ((*interval.start()).max(lo), (*interval.end()).min(hi));
        if a > b {
            continue;
        }
        // `taken` is sorted and unique: every gap between consecutive taken entries holds free offsets.
        let mut candidate = a;
        let mut taken_here = taken.range(a..=b).peekable();
        while found.len() < limit {
            match taken_here.peek() {
                Some(&&t) if t == candidate => {
                    taken_here.next();
                    if candidate == b {
                        break;
                    }
                    candidate += 1;
                }
                _ => {
                    found.push(candidate);
                    if candidate == b {
                        break;
                    }
                    candidate += 1;
                }
            }
        }
    }
    found
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
    fn never_an_offset_whereabouts_cannot_read() {
        // A /64 whose lower half is excluded: every usable offset is 2^63 or more, so nothing can be handed out.
        let upper = IpRange::parse("2001:db8::/64", None, None, &ex(&["2001:db8::/65"])).unwrap();
        assert_eq!(upper.first_usable(), Some(1 << 63));
        for strategy in [Strategy::LowestFree, Strategy::Random] {
            assert_eq!(pick(&upper, &set(&[]), strategy, 7), None);
        }
        assert_eq!(pick_near_lowest(&upper, &set(&[]), 8, 7), None);
        // Only the last few offsets below 2^63 are usable and most are taken: the rest is found, nothing above.
        let r =
            IpRange::parse("2001:db8::/64", None, None, &ex(&["2001:db8::/66", "2001:db8::4000:0:0:0/67"])).unwrap();
        let first = r.first_usable().unwrap();
        assert_eq!(first, 3 << 61);
        let taken: BTreeSet<u128> = (first..first + 5000).collect();
        assert_eq!(pick(&r, &taken, Strategy::LowestFree, 0), Some(first + 5000));
        for seed in [0, 3, u64::MAX, 0x8000_0000_0000_0000] {
            let o = pick(&r, &taken, Strategy::Random, seed).unwrap();
            assert!(o <= MAX_OFFSET && !taken.contains(&o), "seed {seed}: {o}");
        }
    }

    #[test]
    fn near_lowest_stays_among_the_lowest_free() {
        let r = IpRange::parse("10.0.0.0/24", None, None, &[]).unwrap();
        let taken = set(&[1, 2, 4, 7]);
        // free from the bottom: 3, 5, 6, 8, 9, ...
        assert_eq!(pick_near_lowest(&r, &taken, 1, 12345), Some(3));
        let picks: BTreeSet<u128> = (0..200).filter_map(|seed| pick_near_lowest(&r, &taken, 4, seed)).collect();
        assert_eq!(picks, set(&[3, 5, 6, 8]));
        let full: BTreeSet<u128> = (1..=254).collect();
        assert_eq!(pick_near_lowest(&r, &full, 4, 1), None);
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
            // The lowest 16 addresses excluded, so that the usable set does not start at offset 1.
            let exclude = format!("{}/124", cidr.network());
            let r = IpRange::parse(&cidr.to_string(), None, None, &[exclude]).unwrap();
            let taken: BTreeSet<u128> = taken.iter().map(|&t| u128::from(t) % top).chain([raw % top]).collect();
            let o = pick(&r, &taken, Strategy::Random, seed).unwrap();
            prop_assert!(r.is_usable(o));
            prop_assert!(!taken.contains(&o));
            prop_assert!(o <= MAX_OFFSET, "offset {} is beyond what Whereabouts reads", o);
            let near = pick_near_lowest(&r, &taken, 8, seed).unwrap();
            prop_assert!(r.is_usable(near) && !taken.contains(&near) && near <= MAX_OFFSET);
        }
    }
}
