//! The reconciler's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CrdLabels {
    pub crd: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvocationLabels {
    /// The CNI command.
    pub command: String,
    /// `ok`, `failed`, or `declined` (left to the binary).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The release (Cargo's version).
    pub version: String,
    /// The commit it was built from ([`crate::REVISION`]).
    pub revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetworkLabels {
    /// The netconf's `name`.
    pub network: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Every metric, registered once.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    /// Usable addresses per pool.
    pub pool_size: Family<PoolLabels, Gauge>,
    /// Allocated addresses per pool.
    pub pool_allocated: Family<PoolLabels, Gauge>,
    /// Addresses given back, by reason.
    pub released: Family<ReasonLabels, Counter>,
    /// Orphaned reservations deleted.
    pub reservations_released: Counter,
    /// Missing reservations of live entries put back.
    pub reservations_restored: Counter,
    /// Addresses found held by more than one pod (reported, both kept).
    pub conflicts_seen: Counter,
    /// Addresses found held by more than one pod in the last cluster reconcile.
    pub conflicts: Gauge,
    /// Node-loop passes over this node's entries and reservations.
    pub node_resyncs: Counter,
    /// Releases the node loop scheduled again after a failure or a too-fresh verdict.
    pub retries: Counter,
    /// Releases that found the entry changed in between (the guarded patch refused): a race lost safely.
    pub patch_conflicts: Counter,
    /// Releases that failed.
    pub release_failures: Counter,
    /// Cluster reconcile runs, and how long they took.
    pub reconcile_runs: Counter,
    pub reconcile_duration: Histogram,
    /// Failed attempts to take or renew the Lease: a reconciler that cannot lead says so once in its log, and
    /// here on every try.
    pub lease_failures: Counter,
    /// Passes of the leader's node-slice controller.
    pub node_slice_passes: Counter,
    /// Fields hereabouts writes that each installed CRD prunes (plus one for a status subresource), as the leader
    /// last found them.
    pub crd_schema_drift: Family<CrdLabels, Gauge>,
    /// CNI invocations the node agent was handed, by command and outcome.
    pub agent_invocations: Family<InvocationLabels, Counter>,
    /// The agent's warm reserves: addresses held for the next ADDs, by network.
    pub agent_warm_addresses: Family<NetworkLabels, Gauge>,
    /// Addresses the agent handed to pods from a reserve whose hand-over has not ended (the API server away).
    pub agent_warm_pending: Gauge,
    /// 1 when the agent keeps no reserve because it must not (Whereabouts' reconciler runs, or could not be ruled
    /// out; the journal cannot be used): its log says why.
    pub agent_warm_refused: Gauge,
    /// Objects the agent's watches copied for its ADDs' plans: its node's slice pools and the NodeSlicePools.
    pub agent_copies: Counter,
    /// Routing-table datastore: claims this node holds, as the last check found them.
    pub routetable_claims: Gauge,
    /// Routing-table datastore: claims of this node another claim as early or earlier contests (reported, kept).
    pub routetable_conflicts: Gauge,
    /// Routing-table datastore: conflicts reported (one Event each).
    pub routetable_conflicts_seen: Counter,
    /// Routing-table datastore: claims whose route is gone from the table.
    pub routetable_routes_missing: Gauge,
    /// Routing-table datastore: claims of gone attachments removed.
    pub routetable_released: Counter,
    /// Routing-table datastore: passes of the claim checker.
    pub routetable_checks: Counter,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hereabouts");
        let m = Self {
            pool_size: Family::default(),
            pool_allocated: Family::default(),
            released: Family::default(),
            reservations_released: Counter::default(),
            reservations_restored: Counter::default(),
            conflicts_seen: Counter::default(),
            conflicts: Gauge::default(),
            node_resyncs: Counter::default(),
            retries: Counter::default(),
            patch_conflicts: Counter::default(),
            release_failures: Counter::default(),
            reconcile_runs: Counter::default(),
            reconcile_duration: Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0]),
            lease_failures: Counter::default(),
            node_slice_passes: Counter::default(),
            crd_schema_drift: Family::default(),
            agent_invocations: Family::default(),
            agent_warm_addresses: Family::default(),
            agent_warm_pending: Gauge::default(),
            agent_warm_refused: Gauge::default(),
            agent_copies: Counter::default(),
            routetable_claims: Gauge::default(),
            routetable_conflicts: Gauge::default(),
            routetable_conflicts_seen: Counter::default(),
            routetable_routes_missing: Gauge::default(),
            routetable_released: Counter::default(),
            routetable_checks: Counter::default(),
            registry: Registry::default(),
        };
        let build: Family<BuildLabels, Gauge> = Family::default();
        let this = BuildLabels { version: env!("CARGO_PKG_VERSION").into(), revision: crate::REVISION.into() };
        build.get_or_create(&this).set(1);
        registry.register(
            "build_info",
            "1, labelled with the binary's version and the commit it was built from",
            build,
        );
        registry.register("pool_size", "Usable addresses of the pool", m.pool_size.clone());
        registry.register("pool_allocated", "Allocated addresses of the pool", m.pool_allocated.clone());
        registry.register("released", "Addresses given back, by reason", m.released.clone());
        registry.register("reservations_released", "Orphaned reservations deleted", m.reservations_released.clone());
        registry.register(
            "reservations_restored",
            "Missing reservations of live entries put back",
            m.reservations_restored.clone(),
        );
        registry.register(
            "conflicts_seen",
            "Addresses found held by more than one pod (reported, both kept)",
            m.conflicts_seen.clone(),
        );
        registry.register(
            "address_conflicts",
            "Addresses held by more than one pod in the last cluster reconcile",
            m.conflicts.clone(),
        );
        registry.register("node_resyncs", "Node-loop passes over this node's entries", m.node_resyncs.clone());
        registry.register("release_retries", "Releases scheduled again by the node loop", m.retries.clone());
        registry.register(
            "patch_conflicts",
            "Releases refused because the entry changed in between",
            m.patch_conflicts.clone(),
        );
        registry.register("release_failures", "Releases that failed", m.release_failures.clone());
        registry.register("reconcile_runs", "Cluster reconcile runs", m.reconcile_runs.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Duration of cluster reconcile runs",
            m.reconcile_duration.clone(),
        );
        registry.register("lease_failures", "Failed attempts to take or renew the Lease", m.lease_failures.clone());
        registry.register(
            "crd_schema_drift",
            "Fields hereabouts writes that the installed CRD prunes (and 1 for a status subresource)",
            m.crd_schema_drift.clone(),
        );
        registry.register(
            "node_slice_passes",
            "Passes of the leader's node-slice controller",
            m.node_slice_passes.clone(),
        );
        registry.register(
            "agent_invocations",
            "CNI invocations handed to the node agent, by command and outcome",
            m.agent_invocations.clone(),
        );
        registry.register(
            "agent_warm_addresses",
            "Addresses the node agent holds in its warm reserve for the next ADDs, by network",
            m.agent_warm_addresses.clone(),
        );
        registry.register(
            "agent_warm_pending",
            "Addresses handed to pods from the warm reserve whose hand-over to the pod has not ended",
            m.agent_warm_pending.clone(),
        );
        registry.register(
            "agent_warm_refused",
            "1 when the node agent keeps no warm reserve because it must not (its log says why)",
            m.agent_warm_refused.clone(),
        );
        registry.register(
            "agent_copies",
            "Objects the node agent's watches copied for its ADDs' plans (its node's slice pools, NodeSlicePools)",
            m.agent_copies.clone(),
        );
        registry.register("routetable_claims", "Routing-table claims this node holds", m.routetable_claims.clone());
        registry.register(
            "routetable_conflicts",
            "Routing-table claims of this node that an as early or earlier claim contests (reported, kept)",
            m.routetable_conflicts.clone(),
        );
        registry.register(
            "routetable_conflicts_seen",
            "Routing-table claim conflicts reported",
            m.routetable_conflicts_seen.clone(),
        );
        registry.register(
            "routetable_routes_missing",
            "Routing-table claims of this node whose host route is gone",
            m.routetable_routes_missing.clone(),
        );
        registry.register(
            "routetable_released",
            "Routing-table claims of gone attachments removed by the checker",
            m.routetable_released.clone(),
        );
        registry.register(
            "routetable_checks",
            "Passes of the routing-table claim checker",
            m.routetable_checks.clone(),
        );
        Self { registry, ..m }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn count_release(&self, reason: &str) {
        self.released.get_or_create(&ReasonLabels { reason: reason.to_string() }).inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    /// Every series the Grafana dashboard in docs/ queries is one the binaries export (a renamed metric would leave
    /// a panel silently empty), and the dashboard is JSON Grafana can import.
    #[test]
    fn the_dashboard_queries_only_exported_metrics() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana-dashboard.json");
        let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        // a family is rendered once it has a series
        let metrics = Metrics::new();
        let pool = super::PoolLabels { pool: "p".into() };
        metrics.pool_size.get_or_create(&pool).set(1);
        metrics.pool_allocated.get_or_create(&pool).set(1);
        metrics.count_release("pod_deleted");
        metrics.crd_schema_drift.get_or_create(&super::CrdLabels { crd: "c".into() }).set(0);
        let invocation = super::InvocationLabels { command: "ADD".into(), outcome: "ok".into() };
        metrics.agent_invocations.get_or_create(&invocation).inc();
        metrics.agent_warm_addresses.get_or_create(&super::NetworkLabels { network: "n".into() }).set(0);
        let text = metrics.render();
        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        let panels = dashboard["panels"].as_array().unwrap();
        assert!(panels.len() >= 8, "{} panels", panels.len());
        let mut named = 0;
        for panel in panels {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if !word.starts_with("hereabouts_") {
                        continue;
                    }
                    named += 1;
                    let family = ["_bucket", "_sum", "_count", "_total"]
                        .iter()
                        .find_map(|s| word.strip_suffix(s))
                        .unwrap_or(word);
                    assert!(
                        families.contains(&family),
                        "panel {:?} queries {word}, which is not exported",
                        panel["title"]
                    );
                }
            }
        }
        assert!(named >= 15, "{named} metric names in the dashboard");
    }

    #[test]
    fn build_info_names_the_version_and_the_commit() {
        let text = Metrics::new().render();
        let line = format!(
            "hereabouts_build_info{{version=\"{}\",revision=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            crate::REVISION
        );
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        assert!(
            !crate::REVISION.is_empty() && crate::REVISION != "unknown",
            "built in a git checkout: {}",
            crate::REVISION
        );
    }
}
