//! The decisions of the routing-table datastore, free of I/O: which address to try, what metric a claim carries,
//! and what a re-check after the propagation wait means.
//!
//! **Who keeps a collided address.** Two nodes that pick the same address within one propagation delay both
//! install a host route for it; each then sees the other's route, learned through the routing daemon. The earlier
//! claim keeps it. A claim's time travels in the route itself: the plugin installs its route with metric
//! `2 × t` (t: milliseconds since the Unix epoch, modulo 2³¹, even), the daemon carries the metric to its peers
//! (BGP MED in the shipped BIRD configuration) and installs a learned claim with metric `MED + 1` (odd). So a
//! learned route never has the metric of a local claim (the kernel refuses two routes with one prefix and one
//! metric in one table, which would hide a tie), and every node reads a claim's time as `metric / 2`.
//!
//! A claimant keeps its address only if every other route to it is strictly later: equal times, or a route of
//! unknown make (a daemon's default metric, another plugin's device route), make it withdraw. The rule is safe
//! whatever the daemon does with the metric — at worst both withdraw and pick again — and lets exactly one of any
//! number of colliding claims keep the address, provided each sees the earliest competing claim (the shipped
//! configuration makes BGP prefer the lowest MED, so the one route it installs is the earliest).

use std::net::IpAddr;

use crate::range::IpRange;

/// One host route in a table, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct HostRoute {
    /// The address (the route is its /32 or /128).
    pub dst: IpAddr,
    /// Its table.
    pub table: u32,
    /// Its protocol number (`proto`).
    pub protocol: u8,
    /// Its metric (`priority`).
    pub metric: u32,
}

/// The metric of a claim made `unix_ms` milliseconds after the epoch: even, and growing with time (modulo 2³²).
pub fn claim_metric(unix_ms: u128) -> u32 {
    let t = u32::try_from(unix_ms % (1 << 31)).expect("below 2^31");
    t << 1
}

/// The claim time a route's metric stands for ([`claim_metric`] for local claims, `MED + 1` for learned ones).
pub fn claim_time(metric: u32) -> u32 {
    metric >> 1
}

/// What a claimant does after the propagation wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No route to the address is as early as ours: the address is ours.
    Keep,
    /// Another route to the address is as early as ours or earlier: withdraw and pick again.
    Withdraw {
        /// The earliest competing route.
        competitor: HostRoute,
    },
    /// Our route is gone (deleted by someone else): the claim did not happen; pick again.
    Lost,
}

/// The verdict on claim `mine` given the routes to its address the table now holds (`seen`, ours among them).
pub fn verdict(mine: &HostRoute, seen: &[HostRoute]) -> Verdict {
    if !seen.contains(mine) {
        return Verdict::Lost;
    }
    let ours = claim_time(mine.metric);
    let competitor = seen
        .iter()
        .filter(|r| r.dst == mine.dst && *r != mine)
        .filter(|r| claim_time(r.metric) <= ours)
        .min_by_key(|r| claim_time(r.metric));
    match competitor {
        Some(c) => Verdict::Withdraw { competitor: *c },
        None => Verdict::Keep,
    }
}

/// Ranges with at most this many addresses to choose from are listed whole, so that the last free address of a
/// tiny range is found at once; larger ones are sampled.
const ENUMERATE_LIMIT: u128 = 4096;
/// Random tries in a large range before it counts as full.
const SAMPLES: u32 = 256;

/// A free address of `range` at random, skipping the first `exclude_first` and last `exclude_last` usable ones and
/// every address `taken` says is; `None` when there is none. `random` gives the random numbers.
pub fn pick(
    range: &IpRange,
    exclude_first: u64,
    exclude_last: u64,
    taken: impl Fn(&IpAddr) -> bool,
    mut random: impl FnMut() -> u64,
) -> Option<IpAddr> {
    let usable = range.usable_count();
    let first = u128::from(exclude_first);
    let window = usable.checked_sub(first + u128::from(exclude_last)).filter(|w| *w > 0)?;
    let at = |k: u128| range.nth_usable(first + k).map(|o| range.addr_at(o));
    let draw = |random: &mut dyn FnMut() -> u64, n: u128| {
        let r = (u128::from(random()) << 64) | u128::from(random());
        r % n
    };
    if window <= ENUMERATE_LIMIT {
        let free: Vec<IpAddr> = (0..window).filter_map(at).filter(|ip| !taken(ip)).collect();
        if free.is_empty() {
            return None;
        }
        let n = u128::try_from(free.len()).expect("fits");
        return Some(free[usize::try_from(draw(&mut random, n)).expect("below len")]);
    }
    (0..SAMPLES).filter_map(|_| at(draw(&mut random, window))).find(|ip| !taken(ip))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn route(dst: &str, protocol: u8, metric: u32) -> HostRoute {
        HostRoute { dst: ip(dst), table: 254, protocol, metric }
    }

    #[test]
    fn metrics_are_even_and_times_round_trip() {
        let m = claim_metric(1_765_000_000_123);
        assert_eq!(m % 2, 0);
        assert_eq!(claim_time(m), u32::try_from(1_765_000_000_123u128 % (1 << 31)).unwrap());
        // a learned claim (MED + 1) reads as the same time as the local one it came from
        assert_eq!(claim_time(m + 1), claim_time(m));
    }

    #[test]
    fn the_earlier_claim_keeps_and_ties_withdraw() {
        let mine = route("198.18.0.5", 192, 2000);
        assert_eq!(verdict(&mine, &[mine]), Verdict::Keep);
        let later = route("198.18.0.5", 12, 3001);
        assert_eq!(verdict(&mine, &[mine, later]), Verdict::Keep);
        let earlier = route("198.18.0.5", 12, 1001);
        assert_eq!(verdict(&mine, &[later, mine, earlier]), Verdict::Withdraw { competitor: earlier });
        let tie = route("198.18.0.5", 12, 2001);
        assert_eq!(verdict(&mine, &[mine, tie]), Verdict::Withdraw { competitor: tie });
        // a device route with no claim time (metric 0) is someone using the address
        let device = route("198.18.0.5", 3, 0);
        assert_eq!(verdict(&mine, &[mine, device]), Verdict::Withdraw { competitor: device });
        assert_eq!(verdict(&mine, &[later]), Verdict::Lost);
    }

    proptest! {
        /// Any number of claims to one address, each seeing the earliest of the others (what the shipped BIRD
        /// configuration installs): at most one keeps it, and when the earliest time is unique, exactly one.
        #[test]
        fn at_most_one_of_colliding_claims_keeps(times in proptest::collection::vec(0u32..50, 1..8)) {
            let claims: Vec<HostRoute> =
                times.iter().enumerate().map(|(i, t)| HostRoute { dst: ip("2001:db8::7"), table: 254, protocol: 192, metric: t << 1 | u32::from(i > 0) }).collect();
            let mut keepers = 0;
            for (i, mine) in claims.iter().enumerate() {
                let earliest_other = claims.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| *r).min_by_key(|r| claim_time(r.metric));
                let mut seen = vec![*mine];
                seen.extend(earliest_other.map(|r| HostRoute { metric: r.metric | 1, protocol: 12, ..r }));
                if verdict(mine, &seen) == Verdict::Keep {
                    keepers += 1;
                }
            }
            let min = *times.iter().min().unwrap();
            let unique = times.iter().filter(|t| **t == min).count() == 1;
            prop_assert!(keepers <= 1);
            prop_assert_eq!(keepers == 1, unique);
        }

        /// A pick is free, usable and outside the excluded counts; it finds the last free address of a small range.
        #[test]
        fn picks_are_free_and_inside_the_window(xf in 0u64..4, xl in 0u64..4, taken_mask in any::<u16>(), seed in any::<u64>()) {
            let range = IpRange::parse("198.18.0.0/28", None, None, &[]).unwrap();
            let usable: Vec<IpAddr> = (0..range.usable_count()).map(|k| range.addr_at(range.nth_usable(k).unwrap())).collect();
            let taken: HashSet<IpAddr> = usable.iter().enumerate().filter(|(i, _)| taken_mask >> i & 1 == 1).map(|(_, a)| *a).collect();
            let window = &usable[usize::try_from(xf).unwrap()..usable.len() - usize::try_from(xl).unwrap()];
            let mut state = seed;
            let got = pick(&range, xf, xl, |ip| taken.contains(ip), || { state = state.wrapping_mul(6364136223846793005).wrapping_add(1); state });
            match got {
                Some(a) => { prop_assert!(window.contains(&a)); prop_assert!(!taken.contains(&a)); }
                None => prop_assert!(window.iter().all(|a| taken.contains(a))),
            }
        }
    }

    #[test]
    fn large_ranges_are_sampled() {
        let range = IpRange::parse("2001:db8::/64", None, None, &[]).unwrap();
        let mut n = 0u64;
        let got = pick(
            &range,
            10,
            10,
            |_| false,
            || {
                n = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
                n
            },
        );
        assert!(range.cidr().contains(&got.unwrap()));
    }
}
