//! Node-affine slices, the decisions without I/O: how a range is cut, which slice an ADD writes to,
//! which free slice a node claims, whose slice it borrows from, and which slices the leader assigns or frees.
//!
//! A `NodeSlicePool` lists every slice of a range with the node that owns it (`""`: free). A node allocates from
//! its own slices first, one object per node, so writers of different nodes never meet on one object; it claims
//! a free slice when its own are full, and borrows a free address from another node's slice only when no slice
//! is free (Calico's non-strict affinity): an ADD fails only when the whole range is full.

use std::collections::BTreeSet;

use ipnet::IpNet;

use k8s_openapi::jiff::Timestamp;

use crate::crd::{IpPool, NodeSliceAllocation, NodeSlicePool};
use crate::names;

use super::growth::{self, Cut, Growth};

pub use crate::cut::{MAX_SLICES, SliceError, SliceSize, divide, parse_slice_size};

/// One slice as a NodeSlicePool lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// Its position in `status.allocations` (what a guarded patch names).
    pub index: usize,
    /// The slice.
    pub cidr: IpNet,
    /// The node that owns it; empty when free.
    pub node: String,
}

impl Slice {
    /// The entry as stored, for the guarded patch that moves it.
    pub fn stored(&self) -> NodeSliceAllocation {
        NodeSliceAllocation { node_name: self.node.clone(), slice_range: names::range_string(self.cidr) }
    }

    /// The IPPool of this slice for its owner, as Whereabouts names per-node pools.
    pub fn pool_name(&self, network_name: &str) -> String {
        names::slice_pool_name(network_name, &self.node, self.cidr)
    }
}

/// The slices `pool` lists, in order. Entries whose range cannot be read (written by hand, or by another tool)
/// are left out: nothing is allocated from what cannot be read.
pub fn slices_of(pool: &NodeSlicePool) -> Vec<Slice> {
    let Some(status) = &pool.status else { return Vec::new() };
    status
        .allocations
        .iter()
        .enumerate()
        .filter_map(|(index, a)| {
            let cidr: IpNet = a.slice_range.parse().ok()?;
            Some(Slice { index, cidr: cidr.trunc(), node: a.node_name.clone() })
        })
        .collect()
}

/// The free slices a claim ahead (of a node that holds no slice of `range`, before its first ADD) may take, in list
/// order: the first of them while claims of `claim_prefix` (or whole smaller slices) one after another each find at
/// least half of `range` free. A network's slices then go to its nodes as it appears (as Whereabouts' node-slice
/// controller gives them), and a range with fewer slices than nodes is left to the nodes that ask. Every node's agent
/// claims at once when a network appears, each on what it read: picking only among these, at most as many claims
/// land as the rule allows, however many agents race.
pub fn claimable_ahead(slices: &[Slice], range: IpNet, claim_prefix: u8) -> Vec<IpNet> {
    let size = |prefix: u8| 1u128.checked_shl(u32::from(range.max_prefix_len() - prefix)).unwrap_or(u128::MAX);
    let free: Vec<IpNet> = slices.iter().filter(|s| s.node.is_empty()).map(|s| s.cidr).collect();
    let mut left = free.iter().map(|c| size(c.prefix_len())).sum::<u128>();
    let half = size(range.prefix_len()).div_ceil(2);
    let mut claimable = Vec::new();
    for cidr in free {
        if left < half {
            break;
        }
        claimable.push(cidr);
        left = left.saturating_sub(size(cidr.prefix_len().max(claim_prefix)));
    }
    claimable
}

/// A slice pool that holds entries, or addresses still cooling: whoever its name says owns the slice does, whatever
/// a NodeSlicePool now says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The node the pool's name gives.
    pub node: String,
    /// The pool.
    pub pool: String,
    /// Its range: the slice asked about, or (adaptive slices) one inside it or around it.
    pub cidr: IpNet,
}

impl Holder {
    /// Whether the pool is of exactly the slice `cidr`.
    pub fn of(&self, cidr: IpNet) -> bool {
        self.cidr == cidr
    }
}

/// Whether `pool` may be of the network `network_name`: a pool hereabouts made says its network in an annotation,
/// which must agree; one Whereabouts made says it by name only.
pub fn of_network(pool: &IpPool, network_name: &str) -> bool {
    let annotated = pool.metadata.annotations.as_ref().and_then(|a| a.get(crate::store::NETWORK_ANNOTATION));
    annotated.is_none_or(|n| n == network_name)
}

/// The slice pools in the network `network_name` that hold something, by pool name ([`of_network`]), whose range
/// is `cidr` or overlaps it (adaptive slices are of many sizes: a slice listed free may hold a smaller one in use).
pub fn holders(pools: &[IpPool], network_name: &str, cidr: IpNet, now: Timestamp) -> Vec<Holder> {
    let mut found: Vec<Holder> = pools
        .iter()
        .filter(|p| of_network(p, network_name))
        .filter(|p| !p.spec.allocations.is_empty() || !crate::cooldown::cooling(p, now).is_empty())
        .filter_map(|p| {
            let range = p.spec.range.parse::<IpNet>().ok()?.trunc();
            if !crate::cut::overlap(range, cidr) {
                return None;
            }
            let pool = p.metadata.name.as_deref()?;
            let node = names::node_of_slice_pool(pool, network_name, range)?;
            Some(Holder { node: node.to_string(), pool: pool.to_string(), cidr: range })
        })
        .collect();
    found.sort_by(|a, b| a.pool.cmp(&b.pool));
    found
}

/// The slices of a lost NodeSlicePool as `node` re-creates it from the slice pools of its network: a slice whose
/// pool of `node` holds something is its own again, the rest are listed free. A node may write only its own
/// slices (the admission policy holds its token to that); the other nodes' slices in use stay theirs through the
/// checks on every claim ([`holders`]) until the leader gives them back. Slices in use smaller than `prefix`
/// (adaptive slices) are listed as they are, what is around them cut to fit ([`growth::cut_around`]).
pub fn rebuilt(
    range: IpNet,
    prefix: u8,
    network_name: &str,
    node: &str,
    pools: &[IpPool],
    now: Timestamp,
) -> Result<Vec<NodeSliceAllocation>, SliceError> {
    let range = range.trunc();
    let used: Vec<IpNet> = holders(pools, network_name, range, now)
        .into_iter()
        .map(|h| h.cidr)
        // a holder lies inside the range or holds it all (ranges nest or are apart): those smaller than a slice
        // are inside
        .filter(|c| c.prefix_len() > prefix)
        .collect();
    Ok(growth::cut_around(divide(range, prefix)?, &used)
        .into_iter()
        .map(|cidr| {
            let own = holders(pools, network_name, cidr, now).iter().any(|h| h.node == node && h.of(cidr));
            NodeSliceAllocation {
                node_name: if own { node.to_string() } else { String::new() },
                slice_range: names::range_string(cidr),
            }
        })
        .collect())
}

/// What an ADD does next in slice mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Allocate in this slice, the node's own.
    Own(Slice),
    /// Claim this free slice for the node, or the part of it the cut names (the rest listed free), then allocate
    /// in it.
    Claim(Cut),
    /// Allocate in another node's slice (no slice is free).
    Borrow(Slice),
    /// Every slice is full.
    Full,
}

/// What a node may do when its own slices are full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lending {
    /// Borrow from another node's slice: a borrowed entry is found again through its reservation, so a network
    /// without reservations does not borrow.
    pub may_borrow: bool,
    /// Claim a free slice only while the node holds fewer than this many (`max_slices_per_node`); `None`, no cap.
    pub max_own: Option<usize>,
    /// The size the node's next slice should have ([`Growth`]): a free slice larger is cut to it.
    pub growth: Growth,
}

/// The next slice to try for `node`, given the slices known to be full in this invocation and the free ones found
/// in use by another node's pool (`unclaimable`). `seed` spreads
/// concurrent nodes over the free slices they claim and the slices they borrow from, so they do not all race for
/// the lowest one. The slice holding `preferred` (the attachment's entry, found before; own or borrowed) comes
/// first — claimed when it is listed free (a NodeSlicePool lost and rebuilt lists a slice in use as free until the
/// leader gives it back), so that the attachment keeps its address — then the node's own slices in list order (the
/// pool of the first stays warm). A free slice is claimed while the node holds fewer than `lending.max_own`;
/// then, and when none is free, it borrows, if `lending.may_borrow`.
pub fn next(
    slices: &[Slice],
    node: &str,
    full: &BTreeSet<IpNet>,
    unclaimable: &BTreeSet<IpNet>,
    preferred: Option<IpNet>,
    lending: Lending,
    seed: u64,
) -> Next {
    let may_borrow = lending.may_borrow;
    let open = |s: &&Slice| !full.contains(&s.cidr);
    if let Some(s) = slices.iter().filter(open).find(|s| Some(s.cidr) == preferred) {
        match s.node.as_str() {
            "" if !unclaimable.contains(&s.cidr) => return Next::Claim(Cut::whole(s.clone())),
            "" => {}
            owner if owner == node => return Next::Own(s.clone()),
            _ => return Next::Borrow(s.clone()),
        }
    }
    // the preferred slice, if it is an open one of the node's own, was taken above
    if let Some(s) = slices.iter().filter(|s| s.node == node).find(open) {
        return Next::Own(s.clone());
    }
    // a free slice found in use (another node's pool of it holds entries) is not claimed
    let held = slices.iter().filter(|s| s.node == node).count();
    let capped = lending.max_own.is_some_and(|max| held >= max);
    let free: Vec<&Slice> =
        slices.iter().filter(|s| !capped && s.node.is_empty() && !unclaimable.contains(&s.cidr)).collect();
    if let Some(cut) = lending.growth.choose(&free, held, seed) {
        return Next::Claim(cut);
    }
    let others: Vec<&Slice> =
        slices.iter().filter(|s| may_borrow && !s.node.is_empty() && s.node != node).filter(open).collect();
    match pick(&others, seed) {
        Some(s) => Next::Borrow(s.clone()),
        None => Next::Full,
    }
}

fn pick<'a>(from: &[&'a Slice], seed: u64) -> Option<&'a Slice> {
    (!from.is_empty()).then(|| from[(seed % from.len() as u64) as usize])
}

/// The slice that holds `ip`'s address, if any.
pub fn slice_of(slices: &[Slice], ip: std::net::IpAddr) -> Option<&Slice> {
    slices.iter().find(|s| s.cidr.contains(&ip))
}

/// What the leader changes in a NodeSlicePool: each node in `assign` that owns no slice gets a free one (lowest
/// first, nodes in name order, as Whereabouts' controller does), so Whereabouts' CNI, which never claims, finds
/// its slice; and a slice `gone` says is a gone node's, its pools empty for long enough, is freed (or given straight
/// to a node in `assign`). A slice with entries stays with its gone owner until its pods are gone: freeing it would
/// rename its pool (the owner is in the name) and lose track of them. A free slice `in_use` says a pool of still
/// uses is given to nobody.
pub fn leader_moves(
    slices: &[Slice],
    assign: &BTreeSet<String>,
    gone: impl Fn(&Slice) -> bool,
    in_use: impl Fn(&Slice) -> bool,
) -> Vec<(Slice, String)> {
    let gone = |s: &Slice| !s.node.is_empty() && gone(s);
    let owners: BTreeSet<&str> =
        slices.iter().filter(|s| !s.node.is_empty() && !gone(s)).map(|s| s.node.as_str()).collect();
    let mut available = slices.iter().filter(|s| (s.node.is_empty() && !in_use(s)) || gone(s));
    let mut moves: Vec<(Slice, String)> = Vec::new();
    for node in assign.iter().filter(|n| !owners.contains(n.as_str())) {
        let Some(s) = available.next() else { break };
        moves.push((s.clone(), node.clone()));
    }
    // what is left of the gone nodes' empty slices is freed
    moves.extend(available.filter(|s| !s.node.is_empty()).map(|s| (s.clone(), String::new())));
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lend(may_borrow: bool) -> Lending {
        Lending { may_borrow, max_own: None, growth: Growth::fixed(26) }
    }
    use proptest::prelude::*;
    use std::net::IpAddr;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn none_claimed() -> BTreeSet<IpNet> {
        BTreeSet::new()
    }

    fn mk(list: &[(&str, &str)]) -> Vec<Slice> {
        list.iter().enumerate().map(|(index, (c, n))| Slice { index, cidr: net(c), node: n.to_string() }).collect()
    }

    /// A slice pool of `node` for `cidr` in network "net", holding `entries` at offsets 1.., and release records
    /// of `released` seconds ago under a one-minute cooldown.
    fn slice_pool(node: &str, cidr: &str, entries: usize, released: &[i64], now: Timestamp) -> IpPool {
        let name = names::slice_pool_name("net", node, net(cidr));
        let mut pool =
            crate::store::NewPool { network_name: "net", ..crate::store::NewPool::new(&name, cidr, 14) }.object();
        for offset in 1..=entries {
            let entry = crate::crd::IpAllocation {
                id: format!("c{offset}"),
                podref: format!("ns/p{offset}"),
                ..Default::default()
            };
            pool.spec.allocations.insert(offset.to_string(), entry);
        }
        if !released.is_empty() {
            let annotations = pool.metadata.annotations.get_or_insert_default();
            annotations.insert(crate::cooldown::COOLDOWN_ANNOTATION.into(), "60".into());
            let at = |secs: i64| (now - k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
            let records = released.iter().enumerate().map(|(i, secs)| ((i + 10).to_string(), at(*secs)));
            pool.spec.released = Some(records.collect());
        }
        pool
    }

    #[test]
    fn a_slice_pool_holds_its_slice_while_it_has_entries_or_addresses_cooling() {
        let now = Timestamp::now();
        let pools = [
            slice_pool("n1", "198.18.90.0/26", 1, &[], now),
            slice_pool("n2", "198.18.90.64/26", 0, &[5], now),
            slice_pool("n3", "198.18.90.128/26", 0, &[3600], now),
            slice_pool("n4", "198.18.90.192/26", 0, &[], now),
        ];
        let held: Vec<String> =
            holders(&pools, "net", net("198.18.90.0/24"), now).into_iter().map(|h| h.node).collect();
        assert_eq!(held, ["n1", "n2"], "an entry, an address still cooling; not a cooled or an empty pool");
        assert_eq!(holders(&pools, "other", net("198.18.90.0/24"), now), [], "another network's pools");
        // with no network name, "net-n1-..." reads as node "net-n1"'s: the annotation tells them apart
        assert_eq!(holders(&pools, "", net("198.18.90.0/24"), now), [], "the unnamed network's pools");
    }

    /// A NodeSlicePool lost and re-created by node n1: its own slices in use, of any size, are its own again, listed
    /// as they are with what is around them cut to fit; another node's in use, an empty pool's, and those inside a
    /// larger pool of an earlier slice size are listed free.
    #[test]
    fn a_lost_list_is_rebuilt_around_the_slices_in_use_of_any_size() {
        let now = Timestamp::now();
        let pools = [
            slice_pool("n1", "198.18.90.80/28", 1, &[], now),
            slice_pool("n1", "198.18.90.128/26", 2, &[], now),
            slice_pool("n2", "198.18.90.192/26", 1, &[], now),
            slice_pool("n1", "198.18.90.0/26", 0, &[], now),
            slice_pool("n1", "198.18.91.0/25", 1, &[], now),
        ];
        let listed: Vec<(String, String)> = rebuilt(net("198.18.90.0/23"), 26, "net", "n1", &pools, now)
            .unwrap()
            .into_iter()
            .map(|a| (a.slice_range, a.node_name))
            .collect();
        let row = |r: &str, n: &str| (r.to_string(), n.to_string());
        assert_eq!(
            listed,
            [
                row("198.18.90.0/26", ""),
                row("198.18.90.64/28", ""),
                row("198.18.90.80/28", "n1"),
                row("198.18.90.96/27", ""),
                row("198.18.90.128/26", "n1"),
                row("198.18.90.192/26", ""),
                row("198.18.91.0/26", ""),
                row("198.18.91.64/26", ""),
                row("198.18.91.128/26", ""),
                row("198.18.91.192/26", ""),
            ]
        );
    }

    #[test]
    fn divides_like_whereabouts_and_for_ipv6() {
        let v4 = divide(net("10.0.0.0/24"), 26).unwrap();
        assert_eq!(v4, [net("10.0.0.0/26"), net("10.0.0.64/26"), net("10.0.0.128/26"), net("10.0.0.192/26")]);
        let v6 = divide(net("2001:db8::/64"), 72).unwrap();
        assert_eq!((v6.len(), v6[1]), (256, net("2001:db8:0:0:100::/72")));
        assert_eq!(divide(net("10.0.0.0/24"), 24).unwrap(), [net("10.0.0.0/24")]);
        assert!(matches!(divide(net("10.0.0.0/24"), 23), Err(SliceError::BadPrefix { .. })));
        assert!(matches!(divide(net("10.0.0.0/8"), 30), Err(SliceError::TooMany { count: 4194304, .. })));
        assert!(matches!(divide(net("2001:db8::/32"), 128), Err(SliceError::TooMany { .. })));
    }

    #[test]
    fn slices_are_claimed_ahead_while_half_the_range_is_free() {
        let may_claim_ahead = |slices: &[Slice], range: IpNet| !claimable_ahead(slices, range, 32).is_empty();
        let range = net("10.0.0.0/24");
        let half = mk(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", "b"), ("10.0.0.128/26", ""), ("10.0.0.192/26", "")]);
        assert!(may_claim_ahead(&half, range));
        let more = mk(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", "b"), ("10.0.0.128/26", "c"), ("10.0.0.192/26", "")]);
        assert!(!may_claim_ahead(&more, range));
        // adaptive slices count by their size, not their number
        let cut = mk(&[
            ("10.0.0.0/25", "a"),
            ("10.0.0.128/28", "b"),
            ("10.0.0.144/28", ""),
            ("10.0.0.160/27", ""),
            ("10.0.0.192/26", ""),
        ]);
        assert!(!may_claim_ahead(&cut, range));
        assert!(may_claim_ahead(&mk(&[("2001:db8::/65", ""), ("2001:db8:0:0:8000::/65", "a")]), net("2001:db8::/64")));
        assert!(!may_claim_ahead(&[], range));
    }

    #[test]
    fn racing_claims_ahead_pick_among_as_many_slices_as_the_rule_allows() {
        let range = net("10.0.0.0/26");
        let free = mk(&[("10.0.0.0/28", ""), ("10.0.0.16/28", ""), ("10.0.0.32/28", ""), ("10.0.0.48/28", "")]);
        // 64 free: claims leave 48, 32, 16 free; the third is the last that starts with half free
        assert_eq!(claimable_ahead(&free, range, 28), [net("10.0.0.0/28"), net("10.0.0.16/28"), net("10.0.0.32/28")]);
        let one = mk(&[("10.0.0.0/28", "a"), ("10.0.0.16/28", "b"), ("10.0.0.32/28", ""), ("10.0.0.48/28", "")]);
        assert_eq!(claimable_ahead(&one, range, 28), [net("10.0.0.32/28")]);
        // adaptive: a free /25 claimed a /28 at a time
        let wide = mk(&[("10.0.0.0/25", ""), ("10.0.0.128/25", "a")]);
        assert_eq!(claimable_ahead(&wide, net("10.0.0.0/24"), 28), [net("10.0.0.0/25")]);
    }

    #[test]
    fn own_slices_first_then_a_free_one_then_borrow() {
        let s = mk(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", ""), ("10.0.0.128/26", "b"), ("10.0.0.192/26", "a")]);
        let none = BTreeSet::new();
        assert_eq!(next(&s, "a", &none, &none_claimed(), None, lend(true), 7), Next::Own(s[0].clone()));
        assert_eq!(
            next(&s, "a", &none, &none_claimed(), Some(net("10.0.0.192/26")), lend(true), 7),
            Next::Own(s[3].clone())
        );
        let full: BTreeSet<IpNet> = [net("10.0.0.0/26"), net("10.0.0.192/26")].into();
        assert_eq!(next(&s, "a", &full, &none_claimed(), None, lend(true), 7), Next::Claim(Cut::whole(s[1].clone())));
        assert_eq!(next(&s, "c", &none, &none_claimed(), None, lend(true), 7), Next::Claim(Cut::whole(s[1].clone())));
        let mut taken = s.clone();
        taken[1].node = "b".into();
        match next(&taken, "a", &full, &none_claimed(), None, lend(true), 7) {
            Next::Borrow(s) => assert_eq!(s.node, "b", "{s:?}"),
            other => panic!("no free slice and a's are full: borrow, not {other:?}"),
        }
        assert_eq!(
            next(&taken, "a", &full, &none_claimed(), None, lend(false), 7),
            Next::Full,
            "no reservations, no borrowing"
        );
        assert_eq!(
            next(&taken, "a", &none, &none_claimed(), Some(net("10.0.0.128/26")), lend(true), 7),
            Next::Borrow(taken[2].clone())
        );
        let all: BTreeSet<IpNet> = s.iter().map(|s| s.cidr).collect();
        assert_eq!(next(&taken, "a", &all, &none_claimed(), None, lend(true), 7), Next::Full);
        // the attachment's slice listed free but in use by another node's pool: neither claimed nor borrowed
        let in_use: BTreeSet<IpNet> = [net("10.0.0.64/26")].into();
        assert_eq!(next(&s, "a", &none, &in_use, Some(net("10.0.0.64/26")), lend(true), 7), Next::Own(s[0].clone()));
    }

    #[test]
    fn a_node_at_its_slice_cap_borrows_rather_than_claim_and_keeps_what_it_holds() {
        let s = mk(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", ""), ("10.0.0.128/26", "b"), ("10.0.0.192/26", "")]);
        let (none, a_full) = (BTreeSet::new(), BTreeSet::from([net("10.0.0.0/26")]));
        let capped = |may_borrow| Lending { may_borrow, max_own: Some(1), growth: Growth::fixed(26) };
        assert_eq!(next(&s, "a", &none, &none_claimed(), None, capped(true), 7), Next::Own(s[0].clone()));
        assert_eq!(
            next(&s, "a", &a_full, &none_claimed(), None, capped(true), 7),
            Next::Borrow(s[2].clone()),
            "one slice held, full: b's is borrowed, the free ones left to other nodes"
        );
        assert_eq!(next(&s, "a", &a_full, &none_claimed(), None, capped(false), 7), Next::Full, "nor claims without");
        let two = Lending { may_borrow: true, max_own: Some(2), growth: Growth::fixed(26) };
        assert!(matches!(next(&s, "a", &a_full, &none_claimed(), None, two, 7), Next::Claim(_)), "under the cap");
        assert!(matches!(next(&s, "c", &none, &none_claimed(), None, capped(true), 7), Next::Claim(_)), "c holds none");
        // the slice of the attachment's own entry, listed free after a rebuild, is still claimed back
        let ours = Some(net("10.0.0.64/26"));
        assert_eq!(
            next(&s, "a", &a_full, &none_claimed(), ours, capped(true), 7),
            Next::Claim(Cut::whole(s[1].clone()))
        );
    }

    proptest! {
        /// However nodes take turns, none ever holds more slices than the cap (bar the one its own entry is in,
        /// which a rebuilt NodeSlicePool may list free), and while a node under the cap finds a free slice it gets
        /// one.
        #[test]
        fn no_node_claims_past_its_cap(cap in 1usize..4, nodes in 1usize..6, order in proptest::collection::vec(0usize..6, 1..60)) {
            let mut slices: Vec<Slice> =
                (0..16).map(|index| Slice { index, cidr: net(&format!("10.0.{index}.0/24")), node: String::new() }).collect();
            let lending = Lending { may_borrow: true, max_own: Some(cap), growth: Growth::fixed(24) };
            for (step, pick) in order.into_iter().enumerate() {
                let node = format!("n{}", pick % nodes);
                let held = slices.iter().filter(|s| s.node == node).count();
                let full: BTreeSet<IpNet> = slices.iter().filter(|s| s.node == node).map(|s| s.cidr).collect();
                match next(&slices, &node, &full, &BTreeSet::new(), None, lending, step as u64) {
                    Next::Claim(Cut { free: s, .. }) => {
                        prop_assert!(held < cap, "{node} holds {held}, cap {cap}, and claims {s:?}");
                        let at = slices.iter().position(|x| x.cidr == s.cidr).unwrap();
                        slices[at].node = node.clone();
                    }
                    other => {
                        let free = slices.iter().any(|s| s.node.is_empty());
                        prop_assert!(held >= cap || !free, "{node} holds {held} < {cap} with a free slice: {other:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_slice_of_the_attachments_entry_listed_free_is_claimed_first() {
        // a NodeSlicePool lost and rebuilt by another node lists the slice holding our entry as free
        let s = mk(&[("10.0.0.0/26", "b"), ("10.0.0.64/26", ""), ("10.0.0.128/26", ""), ("10.0.0.192/26", "")]);
        let none = BTreeSet::new();
        let ours = Some(net("10.0.0.128/26"));
        assert_eq!(next(&s, "a", &none, &none_claimed(), ours, lend(true), 1), Next::Claim(Cut::whole(s[2].clone())));
        assert_eq!(
            next(&s, "a", &none, &none_claimed(), ours, lend(true), 2),
            Next::Claim(Cut::whole(s[2].clone())),
            "whatever the seed"
        );
        // found in use by another node's pool: not claimed, as any free slice
        let unclaimable: BTreeSet<IpNet> = [net("10.0.0.128/26")].into();
        assert_ne!(next(&s, "a", &none, &unclaimable, ours, lend(true), 1), Next::Claim(Cut::whole(s[2].clone())));
    }

    #[test]
    fn the_leader_gives_each_node_a_slice_and_frees_only_empty_slices_of_gone_nodes() {
        let s = mk(&[
            ("10.0.0.0/26", "gone-empty"),
            ("10.0.0.64/26", "gone-busy"),
            ("10.0.0.128/26", "a"),
            ("10.0.0.192/26", ""),
        ]);
        let nodes: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
        let moves = leader_moves(&s, &nodes, |s| s.node == "gone-empty", |_| false);
        // the gone node's empty slice goes straight to b, the free one to c; d waits; gone-busy keeps its slice
        assert_eq!(moves, [(s[0].clone(), "b".to_string()), (s[3].clone(), "c".to_string())]);
        let moves = leader_moves(&s, &["a".to_string()].into(), |s| s.node == "gone-empty", |_| false);
        assert_eq!(moves, [(s[0].clone(), String::new())], "no node needs it: freed");
        assert!(
            leader_moves(&mk(&[("10.0.0.0/26", "a")]), &["a".to_string()].into(), |s| s.node != "a", |_| false)
                .is_empty()
        );
        let moves = leader_moves(&s, &BTreeSet::new(), |s| s.node == "gone-empty", |_| false);
        assert_eq!(moves, [(s[0].clone(), String::new())], "no node to assign to: only the gone node's slice moves");
        let moves = leader_moves(&s, &nodes, |s| s.node == "gone-empty", |s| s.index == 3);
        assert_eq!(moves, [(s[0].clone(), "b".to_string())], "the free slice in use goes to nobody");
    }

    #[test]
    fn an_address_is_found_in_the_slice_that_holds_it() {
        let s = mk(&[("10.0.0.0/26", "a"), ("10.0.0.64/27", ""), ("10.0.0.96/27", "b")]);
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert_eq!(slice_of(&s, ip("10.0.0.100")), Some(&s[2]));
        assert_eq!(slice_of(&s, ip("10.0.0.64")), Some(&s[1]));
        assert_eq!(slice_of(&s, ip("10.0.0.128")), None);
    }

    /// A model of slice mode without I/O: nodes ADD in a random order, each following [`next`] and taking the
    /// lowest free address of the slice it lands on. No address is given twice, no slice gets two owners, and the
    /// range fills completely before anyone hears "full".
    fn fill(range: IpNet, prefix: u8, nodes: u8, order: &[u8], excludes: &[String]) -> Result<(), TestCaseError> {
        fill_growing(range, prefix, Growth::fixed(prefix), nodes, order, excludes)
    }

    /// [`fill`], the slices cut as `growth` says.
    fn fill_growing(
        range: IpNet,
        prefix: u8,
        growth: Growth,
        nodes: u8,
        order: &[u8],
        excludes: &[String],
    ) -> Result<(), TestCaseError> {
        let parent = crate::range::IpRange::parse(&range.to_string(), None, None, excludes).unwrap();
        let mut slices: Vec<Slice> = divide(range, prefix)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(index, cidr)| Slice { index, cidr, node: String::new() })
            .collect();
        let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
        let total = parent.usable_count();
        let mut steps = order.iter().cycle();
        let mut seed = 1u64;
        loop {
            let node = format!("n{}", steps.next().unwrap() % nodes);
            let mut full = BTreeSet::new();
            let got = loop {
                seed = crate::entropy::step(seed);
                let lending = Lending { growth, ..lend(true) };
                match next(&slices, &node, &full, &BTreeSet::new(), None, lending, seed >> 33) {
                    Next::Own(s) | Next::Borrow(s) => {
                        let sub = parent.slice(s.cidr);
                        let free = sub.as_ref().and_then(|sub| {
                            sub.usable_intervals().flatten().map(|o| sub.addr_at(o)).find(|ip| !taken.contains(ip))
                        });
                        match free {
                            Some(ip) => break Some(ip),
                            None => {
                                full.insert(s.cidr);
                            }
                        }
                    }
                    Next::Claim(cut) => {
                        prop_assert!(slices[cut.free.index].node.is_empty(), "claimed an owned slice");
                        let rest = cut.rest();
                        slices[cut.free.index] = Slice { index: cut.free.index, cidr: cut.cidr, node: node.clone() };
                        for cidr in rest {
                            slices.push(Slice { index: slices.len(), cidr, node: String::new() });
                        }
                    }
                    Next::Full => break None,
                }
            };
            match got {
                Some(ip) => {
                    prop_assert!(parent.offset_of(ip).is_some_and(|o| parent.is_usable(o)), "{ip} not usable");
                    prop_assert!(taken.insert(ip), "{ip} given twice");
                }
                None => {
                    prop_assert_eq!(taken.len() as u128, total, "full before the range was");
                    return Ok(());
                }
            }
        }
    }

    proptest! {
        #[test]
        fn a_range_fills_completely_and_no_address_is_given_twice(
            prefix in 26u8..=30,
            nodes in 1u8..6,
            order in proptest::collection::vec(any::<u8>(), 1..40),
            exclude in proptest::option::of(0u8..255),
        ) {
            let excludes: Vec<String> = exclude.map(|o| format!("198.18.0.{o}/30")).into_iter().collect();
            fill(net("198.18.0.0/24"), prefix, nodes, &order, &excludes)?;
        }

        #[test]
        fn an_adaptive_range_fills_completely_and_no_address_is_given_twice(
            largest in 24u8..=27,
            more in 0u8..=4,
            nodes in 1u8..70,
            order in proptest::collection::vec(any::<u8>(), 1..40),
            exclude in proptest::option::of(0u8..255),
        ) {
            let excludes: Vec<String> = exclude.map(|o| format!("198.18.0.{o}/30")).into_iter().collect();
            let growth = Growth { largest, smallest: (largest + more).min(30) };
            fill_growing(net("198.18.0.0/24"), largest, growth, nodes, &order, &excludes)?;
        }

        #[test]
        fn ipv6_slices_fill_too(nodes in 1u8..4, order in proptest::collection::vec(any::<u8>(), 1..10)) {
            fill(net("2001:db8::/120"), 124, nodes, &order, &[])?;
        }

        #[test]
        fn slices_partition_the_usable_addresses(
            len in 20u8..=28,
            extra in 0u8..=4,
            start in proptest::option::of(0u16..1024),
            exclude in proptest::option::of((0u16..1024, 24u8..=32)),
        ) {
            let range = net(&format!("198.18.0.0/{len}"));
            let size = 1u32 << (32 - len);
            let start = start.map(|s| std::net::Ipv4Addr::from(u32::from(range.network().to_string().parse::<std::net::Ipv4Addr>().unwrap()) + u32::from(s) % size).to_string());
            let excludes: Vec<String> = exclude.map(|(o, p)| format!("198.18.{}.{}/{p}", (o >> 8) % 4, o & 255)).into_iter().collect();
            let Ok(parent) = crate::range::IpRange::parse(&range.to_string(), start.as_deref(), None, &excludes) else { return Ok(()) };
            let prefix = (len + extra).min(30);
            let mut union = BTreeSet::new();
            for cidr in divide(range, prefix).unwrap() {
                let Some(sub) = parent.slice(cidr) else { continue };
                for r in sub.usable_intervals() {
                    for o in r {
                        let ip = sub.addr_at(o);
                        prop_assert!(cidr.contains(&ip));
                        prop_assert!(union.insert(ip), "{ip} in two slices");
                    }
                }
            }
            let whole: BTreeSet<IpAddr> = parent.usable_intervals().flatten().map(|o| parent.addr_at(o)).collect();
            prop_assert_eq!(union, whole);
        }
    }
}
