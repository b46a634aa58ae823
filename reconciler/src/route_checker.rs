//! The routing-table datastore's claim checker: every few seconds, the claims this node holds (the records under
//! `route_state_dir`) are judged again by the claim verdict of their ADD (`routetable::claim`), as CHECK judges
//! them.
//!
//! An ADD's verdict holds for what it could see. A claim another node made while the two could not hear each
//! other (a session down, a daemon restarting) arrives later, and then two pods may use one address. The checker
//! reports such a conflict — a Warning Event on the pod, `hereabouts_routetable_conflicts`, and CHECK fails for
//! the attachment — and never withdraws the claim itself: the pod would lose its address without a word, and
//! which of the two pods should keep it is not the checker's to know.
//!
//! It also tidies what DEL and GC could not remove: the claim of an attachment whose pod is gone, finished, or is
//! another pod of the same name (by UID), and older than the grace period, loses its route and record.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hereabouts_ipam::config::{HostRoutes, NodeRouting, node_routing};
use hereabouts_ipam::reconcile::rules::PodView;
use hereabouts_ipam::reconcile::{Cluster, Notice};
use hereabouts_ipam::routetable::records::Records;
use hereabouts_ipam::routetable::{self, Audited, ClaimState, HostRoute, Table};
use tokio_util::sync::CancellationToken;

use crate::http::Health;

/// `--routetable-checker`: whether the claim checker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// When the node's flat file makes the routing-table datastore or `announce_routes` the node's default.
    Auto,
    /// Always, with the flat file's settings (the defaults when there is none): networks that ask for the
    /// routing-table datastore inline.
    On,
    /// Never.
    Off,
}

/// The host routes whose claims the checker judges, if it runs: see [`Switch`].
pub fn settings(flat_file: &Path, switch: Switch) -> anyhow::Result<Option<HostRoutes>> {
    if switch == Switch::Off {
        return Ok(None);
    }
    let node = match node_routing(flat_file) {
        Ok(node) => node,
        Err(hereabouts_ipam::config::ConfigError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            NodeRouting::default()
        }
        Err(e) => anyhow::bail!("the claim checker's settings: {e}"),
    };
    Ok((switch == Switch::On || node.route_table || node.announce).then_some(node.routes))
}

/// The checker of one node.
#[derive(Debug)]
pub struct Checker<T, C> {
    /// The node's routing table.
    pub table: T,
    /// Where the claims and their records are.
    pub routes: HostRoutes,
    /// Pods and Events.
    pub cluster: C,
    /// The metrics.
    pub health: Arc<Health>,
    /// A claim younger than this is never taken for abandoned (an ADD under way, a pod not yet listed).
    pub grace: Duration,
    /// How often the claims are judged.
    pub every: Duration,
    /// How often the pods of the claims are looked up, to tidy what DEL left.
    pub tidy_every: Duration,
}

/// What one pass saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Claims held.
    pub claims: usize,
    /// Claims with an as early or earlier competing claim: `(network, address) -> competitor`.
    pub conflicts: BTreeMap<(String, IpAddr), HostRoute>,
    /// Claims whose route is gone.
    pub missing: usize,
    /// Claims of gone attachments removed.
    pub removed: usize,
}

impl<T: Table, C: Cluster> Checker<T, C> {
    /// Runs passes until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(state_dir = %self.routes.state_dir.display(), table = self.routes.table,
            every = ?self.every, "routing-table claim checker started");
        let mut reported = HashSet::new();
        let mut tidied = Instant::now();
        loop {
            let tidy = tidied.elapsed() >= self.tidy_every;
            if tidy {
                tidied = Instant::now();
            }
            match self.pass(&mut reported, tidy).await {
                Ok(pass) => {
                    tracing::debug!(
                        claims = pass.claims,
                        conflicts = pass.conflicts.len(),
                        missing = pass.missing,
                        removed = pass.removed,
                        "claims checked"
                    );
                }
                Err(e) => tracing::warn!(error = %e, "the claims could not be checked; trying again"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// One pass: judge every claim, report new conflicts, count, and (with `tidy`) remove the claims of gone
    /// attachments. `reported` holds the conflicts already told of, so each is told once while it lasts.
    pub async fn pass(
        &self,
        reported: &mut HashSet<(String, IpAddr, HostRoute)>,
        tidy: bool,
    ) -> Result<Pass, routetable::RouteTableError> {
        let audited = routetable::audit(&self.table, &self.routes).await?;
        let mut pass = Pass::default();
        let mut now_reported = HashSet::new();
        for a in &audited {
            match a.state {
                ClaimState::Held => pass.claims += 1,
                ClaimState::RouteMissing => pass.missing += 1,
                ClaimState::Unreadable => {}
                ClaimState::Conflict { competitor } => {
                    pass.claims += 1;
                    pass.conflicts.insert((a.network.clone(), a.ip), competitor);
                    let key = (a.network.clone(), a.ip, competitor);
                    if !reported.contains(&key) {
                        self.report(a, competitor).await;
                    }
                    now_reported.insert(key);
                }
            }
        }
        *reported = now_reported;
        if tidy {
            for a in &audited {
                pass.removed += usize::from(self.tidy(a).await);
            }
        }
        let metrics = &self.health.metrics;
        metrics.routetable_claims.set(i64::try_from(pass.claims).unwrap_or(i64::MAX));
        metrics.routetable_conflicts.set(i64::try_from(pass.conflicts.len()).unwrap_or(i64::MAX));
        metrics.routetable_routes_missing.set(i64::try_from(pass.missing).unwrap_or(i64::MAX));
        metrics.routetable_checks.inc();
        Ok(pass)
    }

    async fn report(&self, a: &Audited, competitor: HostRoute) {
        let Some(rec) = &a.record else { return };
        let note = format!(
            "{} ({} {}) is also claimed by another route as early or earlier (metric {}, proto {}; ours: metric \
             {}): two pods may be using the address. hereabouts does not take it away; decide which pod keeps it",
            a.ip, a.network, rec.ifname, competitor.metric, competitor.protocol, rec.route.metric
        );
        tracing::warn!(ip = %a.ip, network = %a.network, pod = %rec.pod, container = %rec.container_id,
            ours = rec.route.metric, theirs = competitor.metric, proto = competitor.protocol, "claim conflict");
        self.health.metrics.routetable_conflicts_seen.inc();
        self.cluster
            .publish(&rec.pod, rec.pod_uid.as_deref(), Notice { warning: true, reason: "AddressConflict", note })
            .await;
    }

    /// Removes the claim of `a` when its attachment is gone: past the grace period, and the pod is missing or is
    /// another pod (UID) of that name. Whether it removed it.
    async fn tidy(&self, a: &Audited) -> bool {
        let Some(rec) = &a.record else { return false };
        if SystemTime::now().duration_since(a.made).unwrap_or_default() < self.grace {
            return false;
        }
        let gone = match self.cluster.pod(&rec.pod).await {
            Ok(PodView::Missing) => true,
            // a finished pod's sandbox is gone for good, as the release rules have it
            Ok(PodView::Present { uid, mirror, finished }) => {
                finished || (!mirror && rec.pod_uid.as_ref().is_some_and(|u| *u != uid))
            }
            Err(e) => {
                tracing::debug!(pod = %rec.pod, error = %e, "the pod cannot be read; its claim stays");
                false
            }
        };
        if !gone {
            return false;
        }
        let removed = match Records::open(&self.routes.state_dir, &a.network) {
            Ok(records) => routetable::remove(&self.table, &records, a.ip, Some(rec)).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match removed {
            Ok(()) => {
                tracing::info!(ip = %a.ip, network = %a.network, pod = %rec.pod, container = %rec.container_id,
                    "the claim of a gone attachment removed (its DEL did not)");
                self.health.metrics.routetable_released.inc();
                true
            }
            Err(e) => {
                tracing::warn!(ip = %a.ip, network = %a.network, error = %e, "the claim of a gone attachment stays");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hereabouts_ipam::reconcile::rules::{NodeView, StatefulSetView};
    use hereabouts_ipam::routetable::records::Record;
    use hereabouts_ipam::routetable::{NetRoute, TableError};
    use ipnet::IpNet;

    use super::*;
    use crate::metrics::Metrics;

    #[derive(Debug, Default)]
    struct FakeTable(Mutex<Vec<HostRoute>>);

    impl Table for FakeTable {
        async fn host_routes(&self, table: u32, net: IpNet) -> Result<Vec<HostRoute>, TableError> {
            Ok(self.0.lock().unwrap().iter().filter(|r| r.table == table && net.contains(&r.dst)).copied().collect())
        }
        async fn routes_over(&self, _table: u32, _net: IpNet) -> Result<Vec<NetRoute>, TableError> {
            Ok(Vec::new())
        }
        async fn add(&self, route: &HostRoute, _link: u32) -> Result<(), TableError> {
            self.0.lock().unwrap().push(*route);
            Ok(())
        }
        async fn delete(&self, route: &HostRoute) -> Result<(), TableError> {
            self.0.lock().unwrap().retain(|r| r != route);
            Ok(())
        }
        async fn link_for(&self, _device: Option<&str>, _net: IpNet) -> Result<u32, TableError> {
            Ok(1)
        }
    }

    /// Pods by name (UID), and the Events published.
    #[derive(Debug, Default)]
    struct FakeCluster {
        pods: Mutex<BTreeMap<String, String>>,
        events: Mutex<Vec<(String, Notice)>>,
    }

    impl Cluster for FakeCluster {
        async fn pod(&self, podref: &str) -> Result<PodView, String> {
            Ok(match self.pods.lock().unwrap().get(podref) {
                Some(uid) => PodView::Present { uid: uid.clone(), finished: false, mirror: false },
                None => PodView::Missing,
            })
        }
        async fn statefulset(&self, _: &str, _: &str) -> Result<Option<StatefulSetView>, String> {
            Ok(None)
        }
        async fn ipamclaim(&self, _: &str, _: &str) -> Result<Option<Vec<String>>, String> {
            Ok(None)
        }
        async fn node(&self, _: &str) -> Result<NodeView, String> {
            Ok(NodeView::Present)
        }
        async fn publish(&self, podref: &str, _uid: Option<&str>, notice: Notice) {
            self.events.lock().unwrap().push((podref.to_string(), notice));
        }
    }

    fn route(ip: &str, protocol: u8, metric: u32) -> HostRoute {
        HostRoute { dst: ip.parse().unwrap(), table: 254, protocol, metric }
    }

    #[tokio::test]
    async fn a_conflict_is_reported_once_while_it_lasts_and_gone_attachments_are_tidied() {
        let dir = tempfile::tempdir().unwrap();
        let routes = HostRoutes { table: 254, protocol: 192, device: None, state_dir: dir.path().to_path_buf() };
        let records = Records::open(dir.path(), "net").unwrap();
        let table = FakeTable::default();
        for (ip, pod, uid, metric) in [("198.18.0.5", "ns/a", "u-a", 2000), ("198.18.0.6", "ns/b", "u-b", 2002)] {
            let r = route(ip, 192, metric);
            let rec = Record {
                container_id: format!("c-{pod}"),
                ifname: "net1".into(),
                pod: pod.into(),
                pod_uid: Some(uid.into()),
                route: r,
            };
            records.create(r.dst, &rec).unwrap();
            table.add(&r, 1).await.unwrap();
        }
        let cluster = FakeCluster::default();
        cluster.pods.lock().unwrap().extend([("ns/a".to_string(), "u-a".to_string()), ("ns/b".into(), "u-b".into())]);
        let checker = Checker {
            table,
            routes,
            cluster,
            health: Arc::new(Health { ready: Default::default(), metrics: Metrics::new() }),
            grace: Duration::ZERO,
            every: Duration::from_secs(1),
            tidy_every: Duration::from_secs(1),
        };
        let mut reported = HashSet::new();
        let pass = checker.pass(&mut reported, true).await.unwrap();
        assert_eq!((pass.claims, pass.conflicts.len(), pass.removed), (2, 0, 0));

        // another node's claim on .5, learned with an earlier time
        let earlier = route("198.18.0.5", 12, 1001);
        checker.table.add(&earlier, 1).await.unwrap();
        for _ in 0..3 {
            let pass = checker.pass(&mut reported, false).await.unwrap();
            assert_eq!(pass.conflicts.into_iter().collect::<Vec<_>>(), [(("net".into(), earlier.dst), earlier)]);
        }
        let events = checker.cluster.events.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "told once: {events:?}");
        assert_eq!((events[0].0.as_str(), events[0].1.reason, events[0].1.warning), ("ns/a", "AddressConflict", true));
        assert!(events[0].1.note.starts_with("198.18.0.5 (net net1) is also claimed"), "{:?}", events[0].1.note);
        assert_eq!(checker.health.metrics.routetable_conflicts.get(), 1);
        assert_eq!(checker.health.metrics.routetable_conflicts_seen.get(), 1);
        assert!(checker.table.0.lock().unwrap().contains(&route("198.18.0.5", 192, 2000)), "the live claim stays");

        // the conflict ends, and comes back: told again
        checker.table.delete(&earlier).await.unwrap();
        assert!(checker.pass(&mut reported, false).await.unwrap().conflicts.is_empty());
        checker.table.add(&earlier, 1).await.unwrap();
        checker.pass(&mut reported, false).await.unwrap();
        assert_eq!(checker.cluster.events.lock().unwrap().len(), 2);

        // pod b replaced by another of its name, pod a gone: both claims removed; a live one is never touched
        checker.cluster.pods.lock().unwrap().insert("ns/b".into(), "u-b2".into());
        checker.cluster.pods.lock().unwrap().remove("ns/a");
        let pass = checker.pass(&mut reported, true).await.unwrap();
        assert_eq!(pass.removed, 2);
        assert_eq!(*checker.table.0.lock().unwrap(), [earlier]);
        assert!(records.list().unwrap().is_empty());
        assert_eq!(checker.health.metrics.routetable_released.get(), 2);
    }

    #[test]
    fn the_switch_reads_the_flat_file() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.conf");
        assert_eq!(settings(&absent, Switch::Auto).unwrap(), None);
        assert_eq!(
            settings(&absent, Switch::On).unwrap().unwrap().state_dir,
            Path::new("/var/lib/cni/hereabouts/routes")
        );
        let flat = dir.path().join("hereabouts.conf");
        std::fs::write(&flat, r#"{"datastore": "routetable", "route_state_dir": "/run/hereabouts/routes"}"#).unwrap();
        assert_eq!(settings(&flat, Switch::Auto).unwrap().unwrap().state_dir, Path::new("/run/hereabouts/routes"));
        assert_eq!(settings(&flat, Switch::Off).unwrap(), None);
        std::fs::write(&flat, r#"{"kubernetes": {"kubeconfig": "/etc/k"}}"#).unwrap();
        assert_eq!(settings(&flat, Switch::Auto).unwrap(), None);
        std::fs::write(&flat, r#"{"route_state_dir": 5}"#).unwrap();
        assert!(settings(&flat, Switch::Auto).unwrap_err().to_string().contains("route_state_dir"));
    }
}
