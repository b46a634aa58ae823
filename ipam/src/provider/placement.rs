//! Pure decisions of IaaS provider mode (docs/provider.md): which free address an ADD takes from a provider-backed pool,
//! whether that needs a provider call, and which of an interface's candidate ranges are tried at all.

use std::collections::BTreeMap;

pub use crate::config::provider::{Class, Mode, Placement};
use std::net::IpAddr;

/// The VLAN a provider writes on a sub-interface it is unbinding: such an entry is never handed out.
pub const UNBINDING_VLAN: i64 = -1;

/// A cloud sub-interface as a pool records it (by the CNI when the provider made it, or by the provider itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubInterface {
    /// The node it is attached to.
    pub node: String,
    /// Its MAC address.
    pub mac: String,
    /// Its VLAN; [`UNBINDING_VLAN`] while the provider takes it away.
    pub vlan: i64,
    /// In dual stack, the IPv6 address chosen when it was created; it stays with it for its life.
    pub paired: Option<IpAddr>,
}

impl SubInterface {
    /// Whether the provider is taking it away.
    pub fn unbinding(&self) -> bool {
        self.vlan == UNBINDING_VLAN
    }
}

/// The address an ADD takes, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// A warm address of a node-warm pool on this node: no provider call.
    Warm(u128),
    /// A free address whose sub-interface is cached on this node: no provider call.
    Cached(u128),
    /// A free address with no sub-interface yet: the provider creates one here.
    Fresh(u128),
    /// A free address whose idle sub-interface is cached on another node: the provider moves it here.
    Steal { offset: u128, from: String },
}

impl Pick {
    /// The offset taken.
    pub fn offset(&self) -> u128 {
        match self {
            Pick::Warm(o) | Pick::Cached(o) | Pick::Fresh(o) | Pick::Steal { offset: o, .. } => *o,
        }
    }

    /// Whether the ADD must call the provider before it can answer.
    pub fn calls_provider(&self) -> bool {
        matches!(self, Pick::Fresh(_) | Pick::Steal { .. })
    }
}

/// The address an ADD on `node` takes from a pool in `mode`, among `free` (the free offsets in the allocation
/// strategy's order) given the pool's `sub_interfaces` by offset. A node-warm pool hands out only its warm
/// addresses, and only on its node; a global pool prefers a sub-interface cached here, then an address with none
/// (a provider call, but no other node loses its cache), then another node's idle one. An unbinding entry is never
/// taken. `None`: nothing can be handed out here.
pub fn pick(mode: &Mode, node: &str, free: &[u128], sub_interfaces: &BTreeMap<u128, SubInterface>) -> Option<Pick> {
    let usable = |o: &u128| sub_interfaces.get(o).is_none_or(|s| !s.unbinding());
    let on = |o: &u128, n: &str| sub_interfaces.get(o).is_some_and(|s| s.node == n && !s.unbinding());
    match mode {
        Mode::NodeWarm { node: bound } if bound != node => None,
        Mode::NodeWarm { .. } => free.iter().find(|o| on(o, node)).map(|o| Pick::Warm(*o)),
        Mode::Global => {
            if let Some(o) = free.iter().find(|o| on(o, node)) {
                return Some(Pick::Cached(*o));
            }
            if let Some(o) = free.iter().find(|o| !sub_interfaces.contains_key(o)) {
                return Some(Pick::Fresh(*o));
            }
            free.iter()
                .filter(|o| usable(o))
                .find_map(|o| sub_interfaces.get(o).map(|s| Pick::Steal { offset: *o, from: s.node.clone() }))
        }
    }
}

/// A candidate range: its class, whether it is a node-warm pool, and the caller's handle on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<T> {
    pub class: Class,
    pub warm: bool,
    pub item: T,
}

/// Which candidates to try, in order, and which were left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Narrowed<T> {
    /// The highest class's candidates: node-warm pools first, then the others, each in configured order.
    pub kept: Vec<T>,
    /// Every candidate of a lower class, in configured order: never fallen back to (say so in a warning and an
    /// Event).
    pub ignored: Vec<T>,
}

/// Narrows an interface's configured candidates (before any filtering by node, so the outcome is the same on every
/// node) to the highest class among them.
pub fn narrow<T>(candidates: Vec<Candidate<T>>) -> Narrowed<T> {
    let Some(top) = candidates.iter().map(|c| c.class).max() else {
        return Narrowed { kept: Vec::new(), ignored: Vec::new() };
    };
    let (mut warm, mut rest, mut ignored) = (Vec::new(), Vec::new(), Vec::new());
    for c in candidates {
        match (c.class == top, c.warm) {
            (true, true) => warm.push(c.item),
            (true, false) => rest.push(c.item),
            (false, _) => ignored.push(c.item),
        }
    }
    warm.extend(rest);
    Narrowed { kept: warm, ignored }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sub(node: &str, vlan: i64) -> SubInterface {
        SubInterface { node: node.into(), mac: "02:00:00:00:00:01".into(), vlan, paired: None }
    }

    #[test]
    fn a_global_pool_prefers_the_cache_here_then_a_fresh_address_then_another_nodes() {
        let mut subs = BTreeMap::from([(1, sub("b", 100)), (2, sub("a", 101)), (3, sub("a", UNBINDING_VLAN))]);
        assert_eq!(pick(&Mode::Global, "a", &[1, 2, 3, 4], &subs), Some(Pick::Cached(2)));
        assert_eq!(pick(&Mode::Global, "a", &[1, 3, 4], &subs), Some(Pick::Fresh(4)));
        assert_eq!(pick(&Mode::Global, "a", &[1, 3], &subs), Some(Pick::Steal { offset: 1, from: "b".into() }));
        assert_eq!(pick(&Mode::Global, "a", &[3], &subs), None, "an unbinding entry is never taken");
        subs.clear();
        assert_eq!(pick(&Mode::Global, "a", &[7, 5], &subs), Some(Pick::Fresh(7)), "in the strategy's order");
    }

    #[test]
    fn a_node_warm_pool_hands_out_its_warm_addresses_on_its_node_only() {
        let subs = BTreeMap::from([(1, sub("a", 100)), (2, sub("a", UNBINDING_VLAN))]);
        let warm = Mode::NodeWarm { node: "a".into() };
        assert_eq!(pick(&warm, "a", &[1, 2, 3], &subs), Some(Pick::Warm(1)));
        assert_eq!(pick(&warm, "a", &[2, 3], &subs), None, "no warm address left: no provider call either");
        assert_eq!(pick(&warm, "b", &[1], &subs), None, "bound to node a");
        assert!(!Pick::Warm(1).calls_provider() && !Pick::Cached(1).calls_provider());
        assert!(Pick::Fresh(1).calls_provider() && Pick::Steal { offset: 1, from: "b".into() }.calls_provider());
    }

    #[test]
    fn candidates_narrow_to_the_highest_class_warm_first() {
        let c = |class, warm, item: &'static str| Candidate { class, warm, item };
        let n = narrow(vec![
            c(Class::Ordinary, false, "plain"),
            c(Class::Provider, false, "global"),
            c(Class::Provider, true, "warm"),
            c(Class::Ordinary, false, "plain2"),
        ]);
        assert_eq!(n.kept, vec!["warm", "global"]);
        assert_eq!(n.ignored, vec!["plain", "plain2"]);
        let n = narrow(vec![c(Class::Provider, true, "warm"), c(Class::PairedProvider, false, "pair")]);
        assert_eq!(n, Narrowed { kept: vec!["pair"], ignored: vec!["warm"] });
        let n = narrow(vec![c(Class::Ordinary, false, "a"), c(Class::Ordinary, false, "b")]);
        assert_eq!(n, Narrowed { kept: vec!["a", "b"], ignored: vec![] });
        assert_eq!(narrow::<&str>(vec![]), Narrowed { kept: vec![], ignored: vec![] });
    }

    fn subs_strategy() -> impl Strategy<Value = BTreeMap<u128, SubInterface>> {
        proptest::collection::btree_map(
            0u128..32,
            (0usize..3, prop_oneof![Just(UNBINDING_VLAN), 1i64..4000])
                .prop_map(|(n, vlan)| sub(["a", "b", "c"][n], vlan)),
            // dense, so that every free address having a sub-interface (the steal case) is common
            16..32,
        )
    }

    proptest! {
        #[test]
        fn a_pick_is_free_never_unbinding_and_the_most_preferred(
            subs in subs_strategy(),
            free in proptest::collection::btree_set(0u128..32, 0..10),
            warm in any::<bool>(),
        ) {
            let free: Vec<u128> = free.into_iter().collect();
            let mode = if warm { Mode::NodeWarm { node: "a".into() } } else { Mode::Global };
            let on_a = free.iter().any(|o| subs.get(o).is_some_and(|s| s.node == "a" && !s.unbinding()));
            let fresh = free.iter().any(|o| !subs.contains_key(o));
            let usable = free.iter().any(|o| subs.get(o).is_none_or(|s| !s.unbinding()));
            match pick(&mode, "a", &free, &subs) {
                None => {
                    prop_assert!(!on_a, "a cached or warm address was left");
                    prop_assert!(warm || !usable, "a global pool had a usable address");
                }
                Some(p) => {
                    prop_assert!(free.contains(&p.offset()), "only free addresses");
                    prop_assert!(subs.get(&p.offset()).is_none_or(|s| !s.unbinding()), "never unbinding");
                    match &p {
                        Pick::Warm(o) | Pick::Cached(o) => prop_assert_eq!(&subs[o].node, "a"),
                        Pick::Fresh(o) => {
                            prop_assert!(!on_a && !subs.contains_key(o));
                        }
                        Pick::Steal { offset, from } => {
                            prop_assert!(!on_a && !fresh);
                            prop_assert_eq!(&subs[offset].node, from);
                        }
                    }
                    prop_assert!(!warm || matches!(p, Pick::Warm(_)), "a node-warm pool never calls the provider");
                }
            }
        }

        #[test]
        fn narrowing_keeps_one_class_and_loses_nothing(
            classes in proptest::collection::vec((0u8..3, any::<bool>()), 0..12),
        ) {
            let to_class = |c: u8| [Class::Ordinary, Class::Provider, Class::PairedProvider][c as usize];
            let candidates: Vec<Candidate<usize>> = classes
                .iter()
                .enumerate()
                .map(|(i, (c, warm))| Candidate { class: to_class(*c), warm: *warm, item: i })
                .collect();
            let top = classes.iter().map(|(c, _)| to_class(*c)).max();
            let n = narrow(candidates);
            prop_assert_eq!(n.kept.len() + n.ignored.len(), classes.len());
            for i in &n.kept {
                prop_assert_eq!(Some(to_class(classes[*i].0)), top);
            }
            for i in &n.ignored {
                prop_assert!(Some(to_class(classes[*i].0)) < top);
            }
            let first_global = n.kept.iter().position(|i| !classes[*i].1).unwrap_or(n.kept.len());
            prop_assert!(n.kept[first_global..].iter().all(|i| !classes[*i].1), "warm pools first");
        }
    }
}
