//! `ipam check`: every inconsistency between the pools, the reservations, the pods and the Nodes, read-only; exit
//! status 1 when any is found. `--repair` then runs the reconciler's own pass (the same judge, the same guarded
//! writes) and checks again: stale entries and orphaned reservations go, missing reservations come back; what
//! needs a person (an address held twice, an offset Whereabouts cannot read, a gone node's slice) is reported.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::Context as _;
use hereabouts_ipam::allocator::MAX_OFFSET;
use hereabouts_ipam::claim::{address_of, reservation_of};
use hereabouts_ipam::crd::{NodeSlicePool, OverlappingRangeIpReservation};
use hereabouts_ipam::reconcile::rules::{
    EntryClaim, Facts, Index, Keep, NodeView, PodView, ReservationVerdict, StatefulSetView, Verdict, entry_claim,
    judge, judge_reservation,
};
use hereabouts_ipam::reconcile::{
    Cluster, Notice, Releaser, parse_duration, read_node, read_statefulset, reconcile_once,
};
use hereabouts_ipam::store::{KubeStore, claimed_at};
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

use crate::KubeFlags;
use crate::output::Format;

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Fix what is safe to fix, as the reconciler would, then check again.
    #[arg(long)]
    repair: bool,
    /// An entry whose pod is missing is left alone while younger than this (an ADD may be under way); the
    /// reconciler's `--grace-period`.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    grace: Duration,
    /// A reservation no entry accounts for is an orphan once its last claim is this old; the reconciler's
    /// `--orphan-age`.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    orphan_age: Duration,
    /// `table`, `json` or `yaml`.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
    /// Also write what was found to this file (JSON), for `ipam release --from-report` to give back the stale
    /// entries once a person has read it.
    #[arg(long, value_name = "FILE", conflicts_with = "repair")]
    report: Option<std::path::PathBuf>,
    /// Allow --grace or --orphan-age below the settle time (an ADD may still be writing that long): a repair may
    /// then take the claim of an ADD under way.
    #[arg(long)]
    unsafe_ages: bool,
}

/// One inconsistency.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// An entry whose pod is gone (deleted, finished, or replaced by a new pod of its name): `--repair` releases it.
    StaleEntry { pool: String, ip: String, podref: String, reason: String },
    /// A live pod's entry whose reservation is gone: `--repair` puts it back.
    MissingReservation { pool: String, ip: String, podref: String },
    /// A reservation no entry accounts for, older than any ADD runs: `--repair` releases it.
    OrphanedReservation { reservation: String, podref: String },
    /// One address held by entries (or an entry and a reservation) of two pods: needs a person.
    HeldTwice { reservation: String, pods: Vec<String> },
    /// An entry at an offset Whereabouts reads as negative or drops (2^63 or more): needs a person.
    UnreadableOffset { pool: String, offset: String },
    /// A NodeSlicePool slice owned by a Node that no longer exists: the leader reconciler frees it once empty.
    GoneNodeSlice { node_slice_pool: String, slice: String, node: String },
    /// A pool with finalizers (the Whereabouts fork adds one): a pool hereabouts' leader deletes with a freed slice
    /// then lingers, and the other tool decides when it goes.
    Finalizers { pool: String, finalizers: Vec<String> },
    /// An installed CRD whose schema drops what hereabouts writes (Whereabouts' or its fork's): apply `crds/`.
    SchemaDrift { crd: String, pruned: Vec<String>, status_subresource: bool, consequences: Vec<String> },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::StaleEntry { pool, ip, podref, reason } => {
                write!(f, "stale entry: {ip} in pool {pool} is held by {podref}, whose pod is gone ({reason})")
            }
            Finding::MissingReservation { pool, ip, podref } => {
                write!(f, "missing reservation: {ip} in pool {pool} is held by live pod {podref} without one")
            }
            Finding::OrphanedReservation { reservation, podref } => {
                write!(f, "orphaned reservation: {reservation} ({podref}) has no entry in any pool")
            }
            Finding::HeldTwice { reservation, pods } => {
                write!(f, "held twice: {reservation} by {}", pods.join(" and "))
            }
            Finding::UnreadableOffset { pool, offset } => {
                write!(f, "unreadable offset: pool {pool} has an entry at {offset}, which Whereabouts cannot read")
            }
            Finding::GoneNodeSlice { node_slice_pool, slice, node } => {
                write!(f, "gone node's slice: {slice} of {node_slice_pool} belongs to node {node}, which is gone")
            }
            Finding::Finalizers { pool, finalizers } => {
                write!(
                    f,
                    "finalizers: pool {pool} has {} (another tool's; a mixed fleet with the Whereabouts fork is not supported)",
                    finalizers.join(", ")
                )
            }
            Finding::SchemaDrift { crd, pruned, status_subresource, consequences } => {
                let subresource = if *status_subresource { ", has a status subresource" } else { "" };
                write!(
                    f,
                    "schema drift: {crd} prunes {}{subresource} ({}): apply hereabouts' CRDs (kubectl apply -f crds/)",
                    if pruned.is_empty() { "nothing".to_string() } else { pruned.join(", ") },
                    consequences.join("; ")
                )
            }
        }
    }
}

/// Refuses ages below the settle time without `--unsafe-ages`: an entry or a reservation younger than that may
/// belong to an ADD still under way, and taking it makes the ADD's entry land unreserved.
fn safe_ages(args: &CheckArgs) -> anyhow::Result<()> {
    let settle = hereabouts_ipam::SETTLE_TIME;
    for (flag, age) in [("--grace", args.grace), ("--orphan-age", args.orphan_age)] {
        if age < settle && !args.unsafe_ages {
            anyhow::bail!(
                "{flag} {} s is below the settle time ({} s): an ADD may still be writing what is that young; \
                 --unsafe-ages allows it",
                age.as_secs(),
                settle.as_secs()
            );
        }
    }
    Ok(())
}

pub async fn run(flags: &KubeFlags, args: &CheckArgs) -> anyhow::Result<bool> {
    safe_ages(args)?;
    let (client, namespace) = crate::client::connect(flags).await?;
    crate::client::on_server_clock(&client).await?;
    let found = check(&client, &namespace, args).await?;
    if !args.repair {
        if let Some(path) = &args.report {
            let report = Report { namespace: namespace.clone(), findings: found.clone() };
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)
                .with_context(|| format!("write the report {}", path.display()))?;
            eprintln!("report written to {}", path.display());
        }
        print(&found, args.output)?;
        return Ok(found.is_empty());
    }
    let releaser = Releaser {
        store: KubeStore::new(client.clone(), &namespace),
        cluster: CliCluster(client.clone()),
        tally: (),
        grace: args.grace,
        orphan_age: args.orphan_age,
        missing_nodes: Default::default(),
    };
    let summary = reconcile_once(&releaser).await.context("repair")?;
    let left = check(&client, &namespace, args).await?;
    if args.output.structured() {
        let report = serde_json::json!({"found": found, "repaired": {
            "entries_released": summary.released, "reservations_released": summary.reservations_released,
            "reservations_restored": summary.restored, "entries_moved": summary.entries_moved,
            "replaced_pools_retired": summary.pools_retired}, "left": left});
        args.output.emit(&report)?;
    } else {
        for f in &found {
            println!("{f}");
        }
        println!(
            "repaired: {} entries released, {} reservations released, {} reservations restored{}",
            summary.released,
            summary.reservations_released,
            summary.restored,
            match (summary.entries_moved, summary.pools_retired) {
                (0, 0) => String::new(),
                (moved, retired) => format!(
                    ", {moved} entries moved into the pools that replaced theirs, {retired} empty replaced pools deleted"
                ),
            }
        );
        for f in &left {
            println!("left: {f}");
        }
        println!("{} found, {} left", found.len(), left.len());
    }
    Ok(left.is_empty())
}

/// What `--report` writes: the namespace checked and what was found there.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Report {
    pub namespace: String,
    pub findings: Vec<Finding>,
}

fn print(found: &[Finding], output: Format) -> anyhow::Result<()> {
    if output.structured() {
        output.emit(&found)?;
    } else {
        for f in found {
            println!("{f}");
        }
        println!("{} found", found.len());
    }
    Ok(())
}

/// Every inconsistency in `namespace`, read-only.
pub async fn check(client: &Client, namespace: &str, args: &CheckArgs) -> anyhow::Result<Vec<Finding>> {
    let lp = ListParams::default();
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .context("list reservations")?
        .items;
    // one list of the NodeSlicePools: what explains the slice pools, and whose slices may be a gone node's
    let slices = node_slices(client, namespace).await?;
    let pools = crate::client::pools_with(client, namespace, &slices).await?;
    let listed: HashMap<&str, _> =
        reservations.iter().map(|r| (r.metadata.name.as_deref().unwrap_or_default(), &r.spec)).collect();
    let now = hereabouts_ipam::clock::now();
    let entries: usize = pools.iter().map(|p| p.spec.allocations.len()).sum();
    eprintln!(
        "checking: {} pools with {entries} entries and {} reservations in namespace {namespace}",
        pools.len(),
        reservations.len()
    );
    let podrefs = pools.iter().flat_map(|p| p.spec.allocations.values().map(|e| e.podref.as_str()));
    let views = crate::client::pod_views(client, podrefs).await?;
    let mut found = BTreeSet::new();
    for pool in &pools {
        let pool_name = pool.metadata.name.clone().unwrap_or_default();
        for (key, entry) in &pool.spec.allocations {
            let Ok(offset) = key.parse::<u128>() else { continue };
            if offset > MAX_OFFSET {
                found.insert(Finding::UnreadableOffset { pool: pool_name.clone(), offset: key.clone() });
            }
            let ip = address_of(pool, offset).map_or_else(|| format!("offset {offset}"), |ip| ip.to_string());
            let sticky = crate::client::sticky(client, entry).await?;
            let claimed = crate::client::claimed(client, entry, address_of(pool, offset)).await?;
            let facts = Facts { pod: &views[&entry.podref], gone_uid: None, now, grace: args.grace, sticky, claimed };
            match judge(entry, &facts) {
                Verdict::Release(reason) => {
                    let reason = reason.as_str().into();
                    let (pool, podref) = (pool_name.clone(), entry.podref.clone());
                    found.insert(Finding::StaleEntry { pool, ip, podref, reason });
                }
                Verdict::Keep(Keep::Live | Keep::Sticky | Keep::Claimed) => {
                    let name = reservation_of(pool, offset);
                    match entry_claim(entry, name.as_deref().and_then(|n| listed.get(n).copied())) {
                        EntryClaim::Fine => {}
                        EntryClaim::Missing => {
                            let (pool, podref) = (pool_name.clone(), entry.podref.clone());
                            found.insert(Finding::MissingReservation { pool, ip, podref });
                        }
                        EntryClaim::Conflict(other) => {
                            let mut pods = vec![entry.podref.clone(), other];
                            pods.sort();
                            found.insert(Finding::HeldTwice { reservation: name.unwrap_or_default(), pods });
                        }
                    }
                }
                Verdict::Keep(_) => {}
            }
        }
    }
    let index = Index::new(&pools);
    for (name, pods) in index.doubly_held() {
        let pods = pods.into_iter().map(str::to_string).collect();
        found.insert(Finding::HeldTwice { reservation: name.to_string(), pods });
    }
    for reservation in &reservations {
        let name = reservation.metadata.name.clone().unwrap_or_default();
        let known = !index.pools_for(&name).is_empty();
        let verdict = judge_reservation(
            &reservation.spec,
            claimed_at(reservation),
            index.holders(&name),
            known,
            now,
            args.orphan_age,
        );
        if verdict == ReservationVerdict::Release {
            found.insert(Finding::OrphanedReservation { reservation: name, podref: reservation.spec.podref.clone() });
        }
    }
    found.extend(gone_node_slices(client, &slices).await?);
    for pool in &pools {
        if let Some(finalizers) = pool.metadata.finalizers.as_ref().filter(|f| !f.is_empty()) {
            let pool = pool.metadata.name.clone().unwrap_or_default();
            found.insert(Finding::Finalizers { pool, finalizers: finalizers.clone() });
        }
    }
    let drift = schema_drift(client).await.unwrap_or_else(|e| {
        eprintln!("warning: {e:#}: the CRDs' schema is not checked");
        Vec::new()
    });
    found.extend(drift.into_iter().map(|d| Finding::SchemaDrift {
        consequences: d.consequences(),
        crd: d.crd,
        pruned: d.pruned,
        status_subresource: d.status_subresource,
    }));
    Ok(found.into_iter().collect())
}

/// How each of hereabouts' CRDs, as installed, drops what hereabouts writes; the clean ones left out. A CRD that
/// cannot be read is an error naming it.
pub async fn schema_drift(client: &Client) -> anyhow::Result<Vec<hereabouts_ipam::crd::drift::Drift>> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut found = Vec::new();
    for (_, ours) in hereabouts_ipam::crd::definitions() {
        let name = ours.metadata.name.clone().unwrap_or_default();
        let installed = api.get(&name).await.with_context(|| format!("read CRD {name}"))?;
        let drift = hereabouts_ipam::crd::drift::drift(&ours, &installed);
        if !drift.is_clean() {
            found.push(drift);
        }
    }
    Ok(found)
}

/// The NodeSlicePools of `namespace`: what a slice pool Whereabouts made (no network annotation) is read with.
pub async fn node_slices(client: &Client, namespace: &str) -> anyhow::Result<Vec<NodeSlicePool>> {
    let lp = ListParams::default();
    let listed = Api::<NodeSlicePool>::namespaced(client.clone(), namespace).list(&lp).await;
    Ok(listed.context("list NodeSlicePools")?.items)
}

/// Slices of the NodeSlicePools `slices` whose node is not a Node any more.
async fn gone_node_slices(client: &Client, slices: &[NodeSlicePool]) -> anyhow::Result<Vec<Finding>> {
    let lp = ListParams::default();
    if slices.iter().all(|s| s.status.as_ref().is_none_or(|st| st.allocations.is_empty())) {
        return Ok(Vec::new());
    }
    let nodes = Api::<Node>::all(client.clone()).list_metadata(&lp).await.context("list Nodes")?;
    let live: BTreeSet<String> = nodes.items.into_iter().filter_map(|n| n.metadata.name).collect();
    let mut found = Vec::new();
    for pool in slices {
        for slice in pool.status.iter().flat_map(|s| &s.allocations) {
            if !slice.node_name.is_empty() && !live.contains(&slice.node_name) {
                found.push(Finding::GoneNodeSlice {
                    node_slice_pool: pool.metadata.name.clone().unwrap_or_default(),
                    slice: slice.slice_range.clone(),
                    node: slice.node_name.clone(),
                });
            }
        }
    }
    Ok(found)
}

/// The reconciler's view of the cluster for `--repair`: pods read from the API server; notices printed, not
/// published as Events (an operator at a terminal is who should hear them).
pub struct CliCluster(pub Client);

impl Cluster for CliCluster {
    async fn pod(&self, podref: &str) -> Result<PodView, String> {
        crate::client::pod_view(&self.0, podref).await.map_err(|e| format!("{e:#}"))
    }

    async fn statefulset(&self, namespace: &str, name: &str) -> Result<Option<StatefulSetView>, String> {
        read_statefulset(&self.0, namespace, name).await
    }

    async fn ipamclaim(&self, namespace: &str, name: &str) -> Result<Option<Vec<String>>, String> {
        hereabouts_ipam::reconcile::read_ipamclaim(&self.0, namespace, name).await
    }

    async fn node(&self, name: &str) -> Result<NodeView, String> {
        read_node(&self.0, name).await
    }

    async fn publish(&self, podref: &str, _uid: Option<&str>, notice: Notice) {
        eprintln!("{podref}: {}: {}", notice.reason, notice.note);
    }
}
