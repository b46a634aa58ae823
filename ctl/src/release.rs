//! `ipam release --ip X`: gives one address back with the reconciler's guarded writes, after the reconciler's
//! release rule (`judge`) says its pod no longer holds it — or with `--force`, saying what it overrides.
//! `--from-report FILE`: the stale entries a person read in `ipam check --report`'s file, each judged again.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hereabouts_ipam::SETTLE_TIME;
use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::claim::{Reclaimed, pool_scope, reclaim};
use hereabouts_ipam::crd::IpPool;
use hereabouts_ipam::reconcile::rules::{Facts, Keep, PodView, Verdict, judge};
use hereabouts_ipam::store::KubeStore;

use crate::KubeFlags;
use crate::check::{Finding, Report};

/// The time the guarded writes of one release may take.
const BUDGET: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {
    /// The address to give back (in every pool of the namespace whose range has it).
    #[arg(long, required_unless_present = "from_report")]
    ip: Option<IpAddr>,
    /// Release it even though its pod looks alive, or its entry may belong to an ADD still under way.
    #[arg(long, requires = "ip")]
    force: bool,
    /// Give back the stale entries of a report `ipam check --report` wrote: each only if the same pod still holds
    /// it in the same pool and the release rule, asked again now, agrees; every other finding is left to a person.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["ip", "force"])]
    from_report: Option<PathBuf>,
}

/// Which entries a release may touch.
struct Wanted<'a> {
    ip: IpAddr,
    /// Only in this pool, and only while this pod holds it (a report's finding); `None`: every pool, any holder.
    as_reported: Option<(&'a str, &'a str)>,
    force: bool,
}

pub async fn run(flags: &KubeFlags, args: &ReleaseArgs) -> anyhow::Result<bool> {
    let report = match &args.from_report {
        Some(path) => Some(read_report(path)?),
        None => None,
    };
    let mut flags = flags.clone();
    if let Some(report) = &report {
        match &flags.namespace {
            Some(ns) if *ns != report.namespace => anyhow::bail!(
                "the report is of namespace {}, not {ns}: run without -n, or with -n {}",
                report.namespace,
                report.namespace
            ),
            _ => flags.namespace = Some(report.namespace.clone()),
        }
    }
    let (client, namespace) = crate::client::connect(&flags).await?;
    crate::client::on_server_clock(&client).await?;
    let all = crate::client::pools_of(&client, &namespace).await?;
    let store = KubeStore::new(client.clone(), &namespace);
    let Some(report) = report else {
        let ip = args.ip.context("--ip or --from-report")?;
        let wanted = Wanted { ip, as_reported: None, force: args.force };
        let (held, refused) = release(&client, &store, &all, &wanted).await?;
        if held == 0 {
            println!("{ip}: no pool of namespace {namespace} holds it");
        }
        return Ok(refused == 0);
    };
    let mut refused = 0;
    let mut others = 0;
    for finding in &report.findings {
        let Finding::StaleEntry { pool, ip, podref, .. } = finding else {
            others += 1;
            continue;
        };
        let ip: IpAddr = ip.parse().with_context(|| format!("the report's address {ip:?}"))?;
        let wanted = Wanted { ip, as_reported: Some((pool, podref)), force: false };
        let (held, not_released) = release(&client, &store, &all, &wanted).await?;
        if held == 0 {
            println!("left alone: {ip} in pool {pool} is no longer held by {podref}");
        }
        refused += not_released;
    }
    if others > 0 {
        println!("{others} findings of other kinds left: `ipam check --repair` fixes the safe ones, a person the rest");
    }
    Ok(refused == 0)
}

fn read_report(path: &std::path::Path) -> anyhow::Result<Report> {
    let text = std::fs::read(path).with_context(|| format!("read the report {}", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a report of `ipam check --report`", path.display()))
}

/// Releases `wanted.ip` where the release rule (or `--force`) allows it, printing what it did; returns how many
/// entries held it as wanted, and how many of those were not released.
async fn release(
    client: &kube::Client,
    store: &KubeStore,
    pools: &[IpPool],
    wanted: &Wanted<'_>,
) -> anyhow::Result<(usize, usize)> {
    let ip = wanted.ip;
    let mut held = 0;
    let mut refused = 0;
    for pool in pools {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        let Some((range, _)) = pool_scope(pool) else { continue };
        let Some(offset) = range.offset_of(ip) else { continue };
        let Some(entry) = pool.spec.allocations.get(&offset.to_string()) else { continue };
        if wanted.as_reported.is_some_and(|(p, podref)| p != name || entry.podref != podref) {
            continue;
        }
        held += 1;
        let view = crate::client::pod_view(client, &entry.podref).await?;
        let sticky = crate::client::sticky(client, entry).await?;
        let claimed = crate::client::claimed(client, entry, Some(ip)).await?;
        let now = hereabouts_ipam::clock::now();
        let facts = Facts { pod: &view, gone_uid: None, now, grace: SETTLE_TIME, sticky, claimed };
        let reason = match judge(entry, &facts) {
            Verdict::Release(reason) => reason.as_str().to_string(),
            Verdict::Keep(keep) if wanted.force => format!("forced over: {}", why_kept(keep, &view)),
            Verdict::Keep(keep) => {
                let hint = if wanted.as_reported.is_some() { "" } else { "; --force releases it anyway" };
                println!("refused: {ip} in pool {name} is held by {}: {}{hint}", entry.podref, why_kept(keep, &view));
                refused += 1;
                continue;
            }
        };
        match reclaim(store, pool, offset, entry, &Budget::new(BUDGET)).await? {
            Reclaimed::Released => println!("released {ip} in pool {name} from {} ({reason})", entry.podref),
            Reclaimed::Changed => {
                println!("left alone: {ip} in pool {name} changed since it was read (released or taken again)");
                refused += 1;
            }
        }
    }
    Ok((held, refused))
}

fn why_kept(keep: Keep, view: &PodView) -> String {
    match (keep, view) {
        (Keep::Live, PodView::Present { uid, .. }) => format!("its pod is alive (uid {uid})"),
        (Keep::Live, PodView::Missing) => "its pod is alive".into(),
        (Keep::Fresh, _) => format!(
            "it was allocated less than {} s ago and its pod is not known gone: an ADD may still be under way",
            SETTLE_TIME.as_secs()
        ),
        (Keep::Unjudgeable, _) => "its podref is not namespace/name, so no pod can be looked up".into(),
        (Keep::Sticky, _) => "a sticky StatefulSet address: its StatefulSet still wants the pod's ordinal".into(),
        (Keep::Claimed, _) => "an IPAMClaim's address: the claim exists, and its next pod takes it over".into(),
        (Keep::Warm, _) => "a warm address: its Node still exists, and its agent may hand it to a pod".into(),
    }
}
