//! After a round: was any address held twice, does every result have its entry, what was left behind. Read
//! after the round's second metrics snapshot, so these reads are not counted against the plugin.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use kube::Client;
use kube::api::{Api, ListParams};

use crate::invoke::{OpResult, Round};
use crate::k8s::{parse_cidr, retry};
use crate::results::RoundResult;

/// Every IPPool of the round's namespace counts, each read against its own `spec.range`: one pool per range, or
/// one per node slice (whose offsets count from the slice's network).
pub async fn verify(
    admin: &Client,
    r: &Round,
    outs: &[OpResult],
    res: &mut RoundResult,
    churn: bool,
) -> anyhow::Result<()> {
    let lp = ListParams::default();
    let pool_api = Api::<IpPool>::namespaced(admin.clone(), &r.ns);
    let rsv_api = Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), &r.ns);
    let pools = retry(|| pool_api.list(&lp)).await?.items;
    let reservations = retry(|| rsv_api.list(&lp)).await?.items;
    let mut pool_owner: HashMap<Ipv4Addr, String> = HashMap::new();
    for pool in &pools {
        let Ok((net, _)) = parse_cidr(&pool.spec.range) else {
            // what cannot be read cannot be checked: count it rather than skip it silently
            res.pool_conflicts += pool.spec.allocations.len().max(1) as u64;
            continue;
        };
        for (off, entry) in &pool.spec.allocations {
            let ip = Ipv4Addr::from(u32::from(net).wrapping_add(off.parse::<u32>().unwrap_or(0)));
            // slices do not overlap: an address in two pools is held twice
            if let Some(other) = pool_owner.insert(ip, entry.podref.clone())
                && other != entry.podref
            {
                res.pool_conflicts += 1;
            }
        }
    }
    res.left = (pool_owner.len() + reservations.len()) as u64;

    // From the results: intervals in which an address was certainly held (ADD returned .. DEL started).
    let del_start: HashMap<&str, Duration> =
        outs.iter().filter(|o| o.command == "DEL").map(|o| (o.pod.as_str(), o.start)).collect();
    let mut held: BTreeMap<Ipv4Addr, Vec<(Duration, Duration)>> = BTreeMap::new();
    for o in outs.iter().filter(|o| o.command == "ADD") {
        if let Some(ip) = o.ip {
            let until = del_start.get(o.pod.as_str()).copied().unwrap_or(Duration::MAX);
            held.entry(ip).or_default().push((o.end, until));
        }
    }
    for spans in held.values_mut() {
        spans.sort();
        let mut latest_end = Duration::ZERO;
        for (i, (from, until)) in spans.iter().enumerate() {
            if i > 0 && *from < latest_end {
                res.dup_results += 1;
            }
            latest_end = latest_end.max(*until);
        }
    }

    // From the objects: every live result is recorded for its pod, and no reservation names another pod.
    if !churn {
        let mut live_pods = BTreeSet::new();
        for o in outs.iter().filter(|o| o.command == "ADD") {
            if let Some(ip) = o.ip {
                let me = format!("{}/{}", r.ns, o.pod);
                if pool_owner.get(&ip) != Some(&me) {
                    res.pool_conflicts += 1;
                }
                live_pods.insert(me);
            }
        }
        // a warm reserve's entries are its node's, held for pods to come: not leaks
        res.orphans = pool_owner
            .values()
            .filter(|p| !live_pods.contains(*p) && hereabouts_ipam::warm::node_of(p).is_none())
            .count() as u64;
    }
    for rsv in &reservations {
        let name = rsv.metadata.name.clone().unwrap_or_default();
        if let Ok(ip) = name.parse::<Ipv4Addr>()
            && let Some(owner) = pool_owner.get(&ip)
            && *owner != rsv.spec.podref
        {
            res.pool_conflicts += 1;
        }
    }
    Ok(())
}
