//! `ipam release --ip X`: gives one address back with the reconciler's guarded writes, after the reconciler's
//! release rule (`judge`) says its pod no longer holds it — or with `--force`, saying what it overrides.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use hereabouts_ipam::SETTLE_TIME;
use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::claim::{Reclaimed, pool_scope, reclaim};
use hereabouts_ipam::crd::IpPool;
use hereabouts_ipam::reconcile::rules::{Facts, Keep, PodView, Verdict, judge};
use hereabouts_ipam::store::KubeStore;
use kube::Api;
use kube::api::ListParams;

use crate::KubeFlags;

/// The time the guarded writes of one release may take.
const BUDGET: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {
    /// The address to give back (in every pool of the namespace whose range has it).
    #[arg(long)]
    ip: IpAddr,
    /// Release it even though its pod looks alive, or its entry may belong to an ADD still under way.
    #[arg(long)]
    force: bool,
}

pub async fn run(flags: &KubeFlags, args: &ReleaseArgs) -> anyhow::Result<bool> {
    let (client, namespace) = crate::client::connect(flags).await?;
    crate::client::on_server_clock(&client).await?;
    let pools: Api<IpPool> = Api::namespaced(client.clone(), &namespace);
    let mut all = pools.list(&ListParams::default()).await.with_context(|| format!("list pools in {namespace}"))?.items;
    hereabouts_ipam::claim::understand(&mut all, &crate::check::node_slices(&client, &namespace).await?);
    let store = KubeStore::new(client.clone(), &namespace);
    let mut held = 0;
    let mut refused = 0;
    for pool in &all {
        let Some((range, _)) = pool_scope(pool) else { continue };
        let Some(offset) = range.offset_of(args.ip) else { continue };
        let Some(entry) = pool.spec.allocations.get(&offset.to_string()) else { continue };
        held += 1;
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        let view = crate::client::pod_view(&client, &entry.podref).await?;
        let sticky = crate::client::sticky(&client, entry).await?;
        let facts =
            Facts { pod: &view, gone_uid: None, now: hereabouts_ipam::clock::now(), grace: SETTLE_TIME, sticky };
        let reason = match judge(entry, &facts) {
            Verdict::Release(reason) => reason.as_str().to_string(),
            Verdict::Keep(keep) if args.force => format!("forced over: {}", why_kept(keep, &view)),
            Verdict::Keep(keep) => {
                println!(
                    "refused: {} in pool {name} is held by {}: {}; --force releases it anyway",
                    args.ip,
                    entry.podref,
                    why_kept(keep, &view)
                );
                refused += 1;
                continue;
            }
        };
        match reclaim(&store, pool, offset, entry, &Budget::new(BUDGET)).await? {
            Reclaimed::Released => println!("released {} in pool {name} from {} ({reason})", args.ip, entry.podref),
            Reclaimed::Changed => {
                println!("left alone: {} in pool {name} changed since it was read (released or taken again)", args.ip);
                refused += 1;
            }
        }
    }
    if held == 0 {
        println!("{}: no pool of namespace {namespace} holds it", args.ip);
    }
    Ok(refused == 0)
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
        (Keep::Warm, _) => "a warm address: its Node still exists, and its agent may hand it to a pod".into(),
    }
}
