//! The protocol's decisions, without I/O: which entry an ADD keeps or which offset it claims, and whose a
//! reservation or an entry is after a read. The async shells of the claim, the release and the reservation read,
//! ask these, and write.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::allocator::{self, Strategy};
use crate::crd::{IpAllocation, IpPool, OverlappingRangeIpReservationSpec};
use crate::range::IpRange;

/// How many of the lowest free addresses a writer that lost a race spreads over.
pub const SPREAD_WINDOW: usize = 16;

/// The attachment an invocation is for: a pod's interface, in one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me<'a> {
    /// `namespace/name`.
    pub podref: &'a str,
    /// The interface.
    pub ifname: &'a str,
    /// The sandbox.
    pub container: &'a str,
    /// The IPAMClaim (in the pod's namespace) the attachment's addresses belong to: then the attachment is the
    /// claim's, whichever pod of it holds the entry now (a VM's pod before and after a migration or a restart).
    pub claim: Option<&'a str>,
}

impl Me<'_> {
    /// Whether `entry` is this attachment's, in any sandbox (of any pod of its IPAMClaim).
    pub fn is_attachment(&self, entry: &IpAllocation) -> bool {
        match self.claim {
            Some(claim) => entry.ipamclaim.as_deref() == Some(claim) && same_namespace(&entry.podref, self.podref),
            None => entry.podref == self.podref && entry.ifname == self.ifname,
        }
    }

    /// Whether `entry` is this attachment's in this sandbox.
    pub fn is_mine(&self, entry: &IpAllocation) -> bool {
        self.is_attachment(entry) && entry.id == self.container && entry.podref == self.podref
    }
}

/// Whether the pod references `a` and `b` (`namespace/name`) are in one namespace.
fn same_namespace(a: &str, b: &str) -> bool {
    matches!((a.split_once('/'), b.split_once('/')), (Some((x, _)), Some((y, _))) if x == y)
}

/// What the ADD of one range does after reading its pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The attachment already holds this entry (a retried ADD, or a new sandbox of the same pod and interface):
    /// keep it, for this sandbox.
    Keep { offset: u128, entry: Box<IpAllocation> },
    /// Claim this free offset.
    Claim(u128),
    /// No usable offset is free.
    Exhausted,
    /// The requested address `ip` is held by `holder` in this pool.
    RequestedTaken { ip: IpAddr, holder: String },
    /// The requested address `ip` may not be handed out from this range.
    RequestedUnusable { ip: IpAddr },
}

/// What the ADD knows when it plans.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// Who asks.
    pub me: &'a Me<'a>,
    /// The range.
    pub range: &'a IpRange,
    /// An exact address asked for in this range, if any.
    pub requested: Option<IpAddr>,
    /// Offsets found held cluster-wide by others (their reservations), though free in this pool.
    pub excluded: &'a BTreeSet<u128>,
    /// An offset to take first if it is free: one whose reservation this attachment already holds.
    pub preferred: Option<u128>,
    /// The configured strategy.
    pub strategy: Strategy,
    /// Whether an earlier attempt lost a race in the pool: spread over the lowest few instead of the lowest.
    pub spread: bool,
    /// Drives the random choices.
    pub seed: u64,
}

/// The entry of `pool` this attachment holds, if any: this sandbox's own first (a repeated ADD gets what it got),
/// else another sandbox's of the attachment, lowest offset first.
pub fn held_by(pool: &IpPool, me: &Me<'_>) -> Option<(u128, IpAllocation)> {
    let held = |mine: bool| {
        pool.spec
            .allocations
            .iter()
            .filter(|(_, a)| if mine { me.is_mine(a) } else { me.is_attachment(a) })
            .find_map(|(k, a)| Some((k.parse().ok()?, a.clone())))
    };
    held(true).or_else(|| held(false))
}

/// Decides what to do with the pool as read.
pub fn plan(pool: &IpPool, ask: &Ask<'_>) -> Plan {
    let held = held_by(pool, ask.me).filter(|(offset, _)| {
        let ip = ask.range.checked_addr_at(*offset);
        ip.is_some() && ask.requested.is_none_or(|r| Some(r) == ip)
    });
    if let Some((offset, entry)) = held {
        return Plan::Keep { offset, entry: Box::new(entry) };
    }
    let taken = |offset: u128| pool.spec.allocations.contains_key(&offset.to_string());
    if let Some(ip) = ask.requested {
        let Some(offset) = ask.range.offset_of(ip).filter(|&o| ask.range.is_usable(o) && o <= ask.range.max_offset())
        else {
            return Plan::RequestedUnusable { ip };
        };
        if let Some(holder) = pool.spec.allocations.get(&offset.to_string()) {
            return Plan::RequestedTaken { ip, holder: holder.podref.clone() };
        }
        return Plan::Claim(offset);
    }
    if let Some(offset) = ask.preferred.filter(|&o| !taken(o) && !ask.excluded.contains(&o) && ask.range.is_usable(o)) {
        return Plan::Claim(offset);
    }
    let mut taken: BTreeSet<u128> = pool.spec.allocations.keys().filter_map(|k| k.parse().ok()).collect();
    taken.extend(ask.excluded);
    let picked = match ask.strategy {
        Strategy::LowestFree if ask.spread => allocator::pick_near_lowest(ask.range, &taken, SPREAD_WINDOW, ask.seed),
        strategy => allocator::pick(ask.range, &taken, strategy, ask.seed),
    };
    picked.map_or(Plan::Exhausted, Plan::Claim)
}

/// Whose a reservation is, to an ADD of `me`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This attachment in this sandbox.
    Me,
    /// This attachment in an earlier sandbox (or a reservation that records no container): this ADD takes it
    /// over.
    MyEarlierSandbox,
    /// Another attachment: the address is not ours.
    Other(String),
}

/// Who holds a reservation, as `me` sees it. A reservation that records no interface (written before
/// Whereabouts recorded one) is the pod's.
pub fn holder(spec: &OverlappingRangeIpReservationSpec, me: &Me<'_>) -> Holder {
    let attachment = match me.claim {
        Some(claim) => spec.ipamclaim.as_deref() == Some(claim) && same_namespace(&spec.podref, me.podref),
        None => spec.podref == me.podref && (spec.ifname.is_empty() || spec.ifname == me.ifname),
    };
    let this_sandbox = spec.podref == me.podref && spec.containerid == me.container && spec.ifname == me.ifname;
    match (attachment, this_sandbox) {
        (true, true) => Holder::Me,
        (true, false) => Holder::MyEarlierSandbox,
        (false, _) => Holder::Other(format!("{} (interface {})", spec.podref, spec.ifname)),
    }
}

/// Whether a release by container `container` of pod `podref` may delete the reservation `spec`: only its own
/// sandbox's claim (or one that records no container) — never another pod's, nor a later sandbox's that took
/// it over.
pub fn is_releasable_by(spec: &OverlappingRangeIpReservationSpec, podref: &str, container: &str) -> bool {
    spec.podref == podref && (spec.containerid.is_empty() || container.is_empty() || spec.containerid == container)
}

/// What the entry at an offset is, after an add there was refused or went unanswered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtOffset {
    /// Ours: the add was applied (its answer was lost) or a retry of ours got there.
    Mine,
    /// The same attachment from another sandbox (a concurrent ADD of the same pod and interface).
    MyAttachment,
    /// Nobody's: the add was refused for another reason than its test.
    Free,
    /// Another pod's: a real collision.
    Other(String),
}

/// Reads the entry at `offset` of `pool` after an add of `me` there did not come back applied.
pub fn at_offset(pool: &IpPool, offset: u128, me: &Me<'_>) -> AtOffset {
    match pool.spec.allocations.get(&offset.to_string()) {
        None => AtOffset::Free,
        Some(entry) if me.is_mine(entry) => AtOffset::Mine,
        Some(entry) if me.is_attachment(entry) => AtOffset::MyAttachment,
        Some(entry) => AtOffset::Other(entry.podref.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::IpPoolSpec;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};

    const ME: Me<'static> = Me { podref: "ns/a", ifname: "net1", container: "c2", claim: None };

    fn mk_entry(podref: &str, ifname: &str, id: &str) -> IpAllocation {
        IpAllocation { id: id.into(), podref: podref.into(), ifname: ifname.into(), ..Default::default() }
    }

    fn mk_pool(entries: &[(u128, IpAllocation)]) -> IpPool {
        let allocations = entries.iter().map(|(o, e)| (o.to_string(), e.clone())).collect();
        IpPool::new("p", IpPoolSpec { range: "10.0.0.0/24".into(), allocations, ..Default::default() })
    }

    fn mk_range() -> IpRange {
        IpRange::parse("10.0.0.0/24", None, None, &[]).unwrap()
    }

    fn ask<'a>(range: &'a IpRange, excluded: &'a BTreeSet<u128>) -> Ask<'a> {
        Ask {
            me: &ME,
            range,
            requested: None,
            excluded,
            preferred: None,
            strategy: Strategy::LowestFree,
            spread: false,
            seed: 0,
        }
    }

    #[test]
    fn keeps_what_the_attachment_holds_in_any_sandbox() {
        let (range, none) = (mk_range(), BTreeSet::new());
        let pool = mk_pool(&[(1, mk_entry("ns/b", "net1", "x")), (7, mk_entry("ns/a", "net1", "c1"))]);
        assert_eq!(
            plan(&pool, &ask(&range, &none)),
            Plan::Keep { offset: 7, entry: Box::new(mk_entry("ns/a", "net1", "c1")) }
        );
        // another interface of the same pod is another attachment
        let pool = mk_pool(&[(7, mk_entry("ns/a", "net2", "c2"))]);
        assert_eq!(plan(&pool, &ask(&range, &none)), Plan::Claim(1));
    }

    #[test]
    fn lowest_stays_lowest_past_addresses_held_elsewhere() {
        let range = mk_range();
        let excluded: BTreeSet<u128> = [1, 2].into();
        let pool = mk_pool(&[(3, mk_entry("ns/b", "net1", "x"))]);
        assert_eq!(plan(&pool, &ask(&range, &excluded)), Plan::Claim(4));
    }

    #[test]
    fn requested_addresses() {
        let (range, none) = (mk_range(), BTreeSet::new());
        let pool = mk_pool(&[(5, mk_entry("ns/b", "net1", "x"))]);
        let mut a = ask(&range, &none);
        a.requested = Some("10.0.0.5".parse().unwrap());
        assert_eq!(plan(&pool, &a), Plan::RequestedTaken { ip: "10.0.0.5".parse().unwrap(), holder: "ns/b".into() });
        a.requested = Some("10.0.0.6".parse().unwrap());
        assert_eq!(plan(&pool, &a), Plan::Claim(6));
        a.requested = Some("10.0.0.255".parse().unwrap());
        assert_eq!(plan(&pool, &a), Plan::RequestedUnusable { ip: "10.0.0.255".parse().unwrap() });
    }

    #[test]
    fn a_preferred_offset_is_taken_when_free() {
        let (range, none) = (mk_range(), BTreeSet::new());
        let mut a = ask(&range, &none);
        a.preferred = Some(9);
        assert_eq!(plan(&mk_pool(&[]), &a), Plan::Claim(9));
        assert_eq!(plan(&mk_pool(&[(9, mk_entry("ns/b", "net1", "x"))]), &a), Plan::Claim(1));
    }

    #[test]
    fn reservation_holders() {
        let spec = |podref: &str, ifname: &str, c: &str| OverlappingRangeIpReservationSpec {
            podref: podref.into(),
            ifname: ifname.into(),
            containerid: c.into(),
            ipamclaim: None,
        };
        assert_eq!(holder(&spec("ns/a", "net1", "c2"), &ME), Holder::Me);
        assert_eq!(holder(&spec("ns/a", "net1", "c1"), &ME), Holder::MyEarlierSandbox);
        assert_eq!(holder(&spec("ns/a", "", "c2"), &ME), Holder::MyEarlierSandbox);
        assert!(matches!(holder(&spec("ns/a", "net2", "c2"), &ME), Holder::Other(_)));
        assert!(matches!(holder(&spec("ns/b", "net1", "c2"), &ME), Holder::Other(_)));
        assert!(is_releasable_by(&spec("ns/a", "net1", "c1"), "ns/a", "c1"));
        assert!(is_releasable_by(&spec("ns/a", "net1", ""), "ns/a", "c1"));
        assert!(!is_releasable_by(&spec("ns/a", "net1", "c2"), "ns/a", "c1"));
        assert!(!is_releasable_by(&spec("ns/b", "net1", "c1"), "ns/a", "c1"));
    }

    #[test]
    fn a_sandbox_keeps_its_own_entry_over_an_earlier_sandboxs_of_its_attachment() {
        // the earlier sandbox's entry (a warm take handed over after this sandbox's ADD) is lower
        let pool = mk_pool(&[(1, mk_entry("ns/a", "net1", "c1")), (3, mk_entry("ns/a", "net1", "c2"))]);
        assert_eq!(held_by(&pool, &ME).map(|(o, _)| o), Some(3));
        let theirs = mk_pool(&[(1, mk_entry("ns/a", "net1", "c1")), (3, mk_entry("ns/b", "net1", "c2"))]);
        assert_eq!(held_by(&theirs, &ME).map(|(o, _)| o), Some(1), "else the attachment's, taken over");
    }

    #[test]
    fn what_is_at_an_offset_after_an_unanswered_add() {
        let pool = mk_pool(&[
            (1, mk_entry("ns/a", "net1", "c2")),
            (2, mk_entry("ns/a", "net1", "c1")),
            (3, mk_entry("ns/b", "net1", "c2")),
        ]);
        assert_eq!(at_offset(&pool, 1, &ME), AtOffset::Mine);
        assert_eq!(at_offset(&pool, 2, &ME), AtOffset::MyAttachment);
        assert_eq!(at_offset(&pool, 3, &ME), AtOffset::Other("ns/b".into()));
        assert_eq!(at_offset(&pool, 4, &ME), AtOffset::Free);
    }

    proptest! {
        /// Whatever the pool holds and whatever is excluded, a planned claim is usable, free in the pool, not
        /// excluded and readable by Whereabouts; with `lowest` and no race it is the lowest such offset.
        #[test]
        fn claims_are_free_usable_and_lowest(
            taken in proptest::collection::btree_set(0u128..64, 0..40),
            excluded in proptest::collection::btree_set(0u128..64, 0..10),
            spread: bool,
            random: bool,
            seed: u64,
        ) {
            let range = IpRange::parse("10.0.0.0/26", None, None, &[]).unwrap();
            let entries: Vec<(u128, IpAllocation)> =
                taken.iter().map(|&o| (o, mk_entry(&format!("ns/p{o}"), "net1", "x"))).collect();
            let pool = mk_pool(&entries);
            let mut a = ask(&range, &excluded);
            a.spread = spread;
            a.seed = seed;
            a.strategy = if random { Strategy::Random } else { Strategy::LowestFree };
            let free: Vec<u128> =
                (0..64).filter(|o| range.is_usable(*o) && !taken.contains(o) && !excluded.contains(o)).collect();
            match plan(&pool, &a) {
                Plan::Claim(o) => {
                    prop_assert!(free.contains(&o));
                    if !spread && !random {
                        prop_assert_eq!(Some(&o), free.first());
                    }
                    if spread && !random {
                        prop_assert!(free.iter().position(|f| *f == o).unwrap() < SPREAD_WINDOW);
                    }
                }
                Plan::Exhausted => prop_assert!(free.is_empty()),
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}
