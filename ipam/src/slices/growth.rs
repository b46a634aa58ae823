//! Adaptive slices (`min_node_slice_size`), the decisions without I/O: a node's first slice is small, each next one
//! twice the size of the one before, up to `node_slice_size`; a slice is cut out of a larger free one when the
//! node claims it (the rest listed free at the end of the NodeSlicePool), so a /22 shared by 64 nodes gives each
//! its own /28, and a /16 shared by four grows theirs to /20s as they fill.
//!
//! The NodeSlicePool keeps Whereabouts' shape: every entry is one slice (`sliceRange`) and its node, only the
//! sizes differ; `spec.sliceSize` stays `node_slice_size`, the largest. The entries always partition the range:
//! a cut replaces one free entry by its first part, claimed, and appends the other parts, free (buddies: every part
//! is aligned to its size), so a range fills to its last address whatever the order of claims.

use ipnet::IpNet;

use super::plan::Slice;

/// How many free slices of the smallest size that fits a claim keeps to itself: with fewer, a claim may cut any
/// free slice large enough (measured: 64 nodes claiming at once on a /22 raced for the few leftover parts, the
/// ADDs' p99 8.7 s against p50 91 ms).
pub const SPREAD: usize = 8;

/// The slice sizes of an adaptive network, as prefix lengths: `largest` is `node_slice_size`, `smallest`
/// `min_node_slice_size` (`largest <= smallest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Growth {
    pub largest: u8,
    pub smallest: u8,
}

/// A free slice to claim, and the part of it the node takes: the whole slice, or its first part of the size
/// wanted (`cidr`), the rest listed free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub free: Slice,
    pub cidr: IpNet,
}

impl Cut {
    /// The whole free slice.
    pub fn whole(free: Slice) -> Self {
        Cut { cidr: free.cidr, free }
    }

    /// Whether the node takes less than the free slice.
    pub fn splits(&self) -> bool {
        self.cidr != self.free.cidr
    }

    /// The parts of the free slice the node does not take, listed free after the cut ([`remainder`]).
    pub fn rest(&self) -> Vec<IpNet> {
        remainder(self.free.cidr, self.cidr)
    }
}

impl Growth {
    /// Every slice of one size (no `min_node_slice_size`): a free slice of that size is claimed whole, a larger one
    /// cut to it.
    pub fn fixed(prefix: u8) -> Self {
        Growth { largest: prefix, smallest: prefix }
    }

    /// The prefix length of the next slice of a node that holds `held`: the smallest first, each next twice the
    /// size, never more than the largest.
    pub fn wanted(&self, held: usize) -> u8 {
        let steps = u8::try_from(held).unwrap_or(u8::MAX).min(self.smallest - self.largest);
        self.smallest - steps
    }

    /// Which of the `free` slices a node holding `held` claims, and what part of it: among the free slices at
    /// least the size wanted, one of the smallest (the others stay whole for nodes that grow) — or any of them when
    /// fewer than [`SPREAD`] are of that size, so that many nodes claiming at once do not all race for the same few
    /// entries; when none is that large, one of the largest there are. `seed` spreads concurrent nodes over the
    /// candidates.
    pub fn choose(&self, free: &[&Slice], held: usize, seed: u64) -> Option<Cut> {
        let want = self.wanted(held);
        let fitting: Vec<&Slice> = free.iter().copied().filter(|s| s.cidr.prefix_len() <= want).collect();
        let candidates: Vec<&Slice> = match fitting.iter().map(|s| s.cidr.prefix_len()).max() {
            Some(smallest) => {
                let sized: Vec<&Slice> = fitting.iter().copied().filter(|s| s.cidr.prefix_len() == smallest).collect();
                if sized.len() >= SPREAD { sized } else { fitting }
            }
            None => {
                let largest = free.iter().map(|s| s.cidr.prefix_len()).min()?;
                free.iter().copied().filter(|s| s.cidr.prefix_len() == largest).collect()
            }
        };
        let free = candidates[(seed % candidates.len() as u64) as usize];
        let size = free.cidr.prefix_len();
        let cidr = if size < want { first_part(free.cidr, want) } else { free.cidr };
        Some(Cut { free: free.clone(), cidr })
    }

    /// The part of the free slice `free` holding `ip` a node holding `held` claims for a requested address.
    pub fn cut_at(&self, free: &Slice, held: usize, ip: std::net::IpAddr) -> Cut {
        let want = self.wanted(held).max(free.cidr.prefix_len());
        let cidr = IpNet::new(ip, want).map(|n| n.trunc()).unwrap_or(free.cidr);
        Cut { free: free.clone(), cidr }
    }
}

fn first_part(block: IpNet, prefix: u8) -> IpNet {
    IpNet::new(block.network(), prefix).map(|n| n.trunc()).unwrap_or(block)
}

/// What is left of `block` once `part` (a slice inside it, aligned to its size) is taken: one slice of each size
/// between theirs, the halves `part` is not in, largest first.
pub fn remainder(block: IpNet, part: IpNet) -> Vec<IpNet> {
    let mut rest = Vec::new();
    let mut at = block.trunc();
    while at.prefix_len() < part.prefix_len() {
        let Ok(mut halves) = at.subnets(at.prefix_len() + 1) else { break };
        let (Some(low), Some(high)) = (halves.next(), halves.next()) else { break };
        if low.contains(&part.network()) {
            rest.push(high);
            at = low;
        } else {
            rest.push(low);
            at = high;
        }
    }
    rest
}

/// Two free slices the leader joins into one (`parent`): buddies of one size smaller than `largest` (the
/// NodeSlicePool's `sliceSize`), both listed free — what is left when a gone node's cut slice was freed, so that
/// later nodes find larger slices again. The first such pair in list order; a slice `in_use` says a pool still uses
/// (listed free after the NodeSlicePool was rebuilt) is left as it is, for the leader to give back to its node.
pub fn joinable(slices: &[Slice], largest: u8, in_use: impl Fn(&Slice) -> bool) -> Option<(Slice, Slice, IpNet)> {
    let free: Vec<&Slice> =
        slices.iter().filter(|s| s.node.is_empty() && s.cidr.prefix_len() > largest && !in_use(s)).collect();
    for a in &free {
        let parent = IpNet::new(a.cidr.network(), a.cidr.prefix_len() - 1).ok()?.trunc();
        let buddy = free.iter().find(|b| {
            b.index != a.index && b.cidr.prefix_len() == a.cidr.prefix_len() && parent.contains(&b.cidr.network())
        });
        if let Some(b) = buddy {
            return Some(((*a).clone(), (*b).clone(), parent));
        }
    }
    None
}

/// `blocks` (a partition of a range) cut so that each of `used` (slices of pools that hold entries) is one of them:
/// a NodeSlicePool rebuilt after it was lost lists the slices as their pools were made, whatever their size.
pub fn cut_around(mut blocks: Vec<IpNet>, used: &[IpNet]) -> Vec<IpNet> {
    let mut used = used.to_vec();
    used.sort_by_key(|u| (u.prefix_len(), *u));
    for u in used {
        let Some(at) = blocks.iter().position(|b| b.contains(&u.network()) && b.prefix_len() < u.prefix_len()) else {
            continue;
        };
        let block = blocks.remove(at);
        blocks.push(u);
        blocks.extend(remainder(block, u));
    }
    blocks.sort();
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn free(list: &[&str]) -> Vec<Slice> {
        list.iter().enumerate().map(|(index, c)| Slice { index, cidr: net(c), node: String::new() }).collect()
    }

    const G: Growth = Growth { largest: 26, smallest: 28 };

    #[test]
    fn a_node_starts_small_and_doubles_up_to_the_largest() {
        assert_eq!([0, 1, 2, 3, 9].map(|held| G.wanted(held)), [28, 27, 26, 26, 26]);
        let fixed = Growth { largest: 26, smallest: 26 };
        assert_eq!(fixed.wanted(0), 26);
    }

    #[test]
    fn the_smallest_fitting_free_slice_is_cut_to_size() {
        // eight free /28s: one of them; the larger slices stay whole
        let mut small: Vec<String> = (0..8).map(|i| format!("198.18.1.{}/28", i * 16)).collect();
        small.extend(["198.18.0.0/26".to_string(), "198.18.0.128/27".to_string()]);
        let listed = free(&small.iter().map(String::as_str).collect::<Vec<_>>());
        let all: Vec<&Slice> = listed.iter().collect();
        for seed in 0..20 {
            let cut = G.choose(&all, 0, seed).unwrap();
            assert!(!cut.splits() && cut.cidr.prefix_len() == 28, "{cut:?}");
        }
        // fewer than eight of the smallest size that fits: any slice large enough, cut to size
        let listed = free(&["198.18.0.0/26", "198.18.0.64/26", "198.18.0.128/27", "198.18.0.160/28"]);
        let all: Vec<&Slice> = listed.iter().collect();
        let picked: BTreeSet<IpNet> = (0..40).map(|seed| G.choose(&all, 0, seed).unwrap().free.cidr).collect();
        assert_eq!(picked.len(), 4, "{picked:?}");
        let cut = G.choose(&all, 1, 2).unwrap();
        assert_eq!((cut.free.cidr, cut.cidr), (net("198.18.0.128/27"), net("198.18.0.128/27")));
        assert_eq!(G.choose(&all, 1, 3).unwrap().free.cidr, net("198.18.0.0/26"), "no /28 fits a /27");
        let cut = G.choose(&all[..2], 0, 1).unwrap();
        assert_eq!((cut.free.cidr, cut.cidr), (net("198.18.0.64/26"), net("198.18.0.64/28")));
        assert_eq!(cut.rest(), [net("198.18.0.96/27"), net("198.18.0.80/28")]);
        // a node that wants a /26 and finds only smaller free slices takes the largest there is
        let cut = G.choose(&all[2..], 2, 5).unwrap();
        assert_eq!(cut.cidr, net("198.18.0.128/27"));
        assert_eq!(G.choose(&[], 0, 0), None);
    }

    #[test]
    fn a_requested_address_gets_the_part_that_holds_it() {
        let listed = free(&["198.18.0.0/26"]);
        let cut = G.cut_at(&listed[0], 0, "198.18.0.37".parse().unwrap());
        assert_eq!(cut.cidr, net("198.18.0.32/28"));
        assert_eq!(cut.rest(), [net("198.18.0.0/27"), net("198.18.0.48/28")]);
        let small = free(&["198.18.0.32/28"]);
        assert_eq!(G.cut_at(&small[0], 2, "198.18.0.37".parse().unwrap()).cidr, net("198.18.0.32/28"));
    }

    #[test]
    fn free_buddies_smaller_than_the_largest_are_joined() {
        let mut listed = free(&["198.18.0.0/26", "198.18.0.64/28", "198.18.0.96/27", "198.18.0.80/28"]);
        listed[0].node = "a".into();
        let unused = |_: &Slice| false;
        let (a, b, parent) = joinable(&listed, 26, unused).unwrap();
        assert_eq!((a.index, b.index, parent), (1, 3, net("198.18.0.64/27")));
        assert_eq!(joinable(&listed, 26, |s| s.index == 3), None, "a part a pool still uses");
        listed[3].node = "b".into();
        assert_eq!(joinable(&listed, 26, unused), None, "a buddy owned");
        let whole = free(&["198.18.0.0/27", "198.18.0.32/27"]);
        assert_eq!(joinable(&whole, 27, unused), None, "not past the NodeSlicePool's sliceSize");
        assert_eq!(joinable(&whole, 26, unused).map(|j| j.2), Some(net("198.18.0.0/26")));
        let strangers = free(&["198.18.0.32/27", "198.18.0.64/27"]);
        assert_eq!(joinable(&strangers, 24, unused), None, "neighbours of different parents");
    }

    #[test]
    fn ipv6_cuts_too() {
        let listed = free(&["2001:db8::/120"]);
        let g = Growth { largest: 120, smallest: 124 };
        let cut = g.choose(&listed.iter().collect::<Vec<_>>(), 0, 0).unwrap();
        assert_eq!(cut.cidr, net("2001:db8::/124"));
        assert_eq!(cut.rest().len(), 4);
    }

    #[test]
    fn a_rebuilt_list_keeps_the_slices_in_use_whatever_their_size() {
        let blocks = vec![net("198.18.0.0/26"), net("198.18.0.64/26")];
        let cut = cut_around(blocks, &[net("198.18.0.80/28"), net("198.18.0.0/27"), net("198.18.0.64/26")]);
        assert_eq!(
            cut,
            [
                net("198.18.0.0/27"),
                net("198.18.0.32/27"),
                net("198.18.0.64/28"),
                net("198.18.0.80/28"),
                net("198.18.0.96/27")
            ]
        );
        // the block cut is the one holding the slice, not the first one large enough
        let cut = cut_around(vec![net("198.18.0.0/26"), net("198.18.0.64/26")], &[net("198.18.0.80/28")]);
        assert_eq!(cut, [net("198.18.0.0/26"), net("198.18.0.64/28"), net("198.18.0.80/28"), net("198.18.0.96/27")]);
    }

    /// The addresses of `cidrs`, each once, or the first given twice.
    fn covered(cidrs: &[IpNet]) -> Result<BTreeSet<u32>, IpNet> {
        let mut all = BTreeSet::new();
        for c in cidrs {
            let IpNet::V4(v4) = c else { return Err(*c) };
            let start = u32::from(v4.network());
            for a in start..=u32::from(v4.broadcast()) {
                if !all.insert(a) {
                    return Err(*c);
                }
            }
        }
        Ok(all)
    }

    proptest! {
        /// However nodes take turns claiming, the list stays a partition of the range (no address in two slices,
        /// none in none), no node's slice grows past the largest, and nodes claim until every address is in a
        /// claimed slice.
        #[test]
        fn claims_keep_the_list_a_partition_and_take_the_whole_range(
            largest in 22u8..=26,
            more in 0u8..=4,
            nodes in 1usize..70,
            order in proptest::collection::vec(any::<u16>(), 1..50),
        ) {
            let g = Growth { largest, smallest: largest + more };
            let range = net("198.18.0.0/22");
            let mut listed: Vec<Slice> = crate::cut::divide(range, largest).unwrap().into_iter().enumerate()
                .map(|(index, cidr)| Slice { index, cidr, node: String::new() }).collect();
            let whole = covered(&[range]).unwrap();
            let mut steps = order.iter().cycle();
            let mut seed = 7u64;
            loop {
                let node = format!("n{}", *steps.next().unwrap() as usize % nodes);
                let held = listed.iter().filter(|s| s.node == node).count();
                let free: Vec<&Slice> = listed.iter().filter(|s| s.node.is_empty()).collect();
                seed = crate::entropy::step(seed);
                let Some(cut) = g.choose(&free, held, seed >> 33) else { break };
                prop_assert!(cut.cidr.prefix_len() >= largest, "{cut:?} larger than /{largest}");
                prop_assert!(cut.free.cidr.contains(&cut.cidr.network()) && cut.free.cidr.prefix_len() <= cut.cidr.prefix_len());
                let at = cut.free.index;
                let rest = cut.rest();
                listed[at] = Slice { index: at, cidr: cut.cidr, node: node.clone() };
                for cidr in rest {
                    let index = listed.len();
                    listed.push(Slice { index, cidr, node: String::new() });
                }
                let cidrs: Vec<IpNet> = listed.iter().map(|s| s.cidr).collect();
                let union = covered(&cidrs).map_err(|c| TestCaseError::fail(format!("{c} overlaps another slice")))?;
                prop_assert_eq!(&union, &whole);
            }
            prop_assert!(listed.iter().all(|s| !s.node.is_empty()), "free slices left unclaimed");
        }
    }
}
