//! `ipam migrate`: the online re-layout the leader reconciler does on its schedule, on demand. A dry run by
//! default: it lists, for each pool a changed config replaced (a range grown, shrunk or moved; slices given up
//! for one pool), the entries that move into the pool that replaced it, at their addresses, and those that cannot
//! (their address outside the new range) and stay until their pod goes. `--apply` makes the moves with the
//! leader's guarded writes, then retires the emptied pools.

use std::time::Duration;

use anyhow::Context as _;
use hereabouts_ipam::SETTLE_TIME;
use hereabouts_ipam::reconcile::{relayout, retire};
use hereabouts_ipam::store::{KubeStore, PoolStore as _};

use crate::KubeFlags;

#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// Make the moves (and retire the emptied pools); without it, only say what they would be.
    #[arg(long)]
    apply: bool,
    /// How old a replacing pool must be before its replaced pools' entries move: longer than any ADD under the old
    /// config can still run (the reconciler's --orphan-age).
    #[arg(long, value_parser = hereabouts_ipam::reconcile::parse_duration, default_value = "5m")]
    settle: Duration,
    /// Allow --settle below the settle time (an ADD may still be writing that long).
    #[arg(long)]
    unsafe_ages: bool,
}

pub async fn run(flags: &KubeFlags, args: &MigrateArgs) -> anyhow::Result<bool> {
    if args.settle < SETTLE_TIME && !args.unsafe_ages {
        anyhow::bail!(
            "--settle {} s is below the settle time ({} s): an ADD under the old config may still be writing into a \
             pool being emptied; --unsafe-ages allows it",
            args.settle.as_secs(),
            SETTLE_TIME.as_secs()
        );
    }
    let (client, namespace) = crate::client::connect(flags).await?;
    let store = KubeStore::new(client.clone(), &namespace);
    eprintln!("reading the pools of namespace {namespace} ...");
    let pools = store.list_pools().await.context("list the pools")?;
    // pools' ages judged on the API server's clock, which stamped them
    crate::client::on_server_clock(&client).await?;
    let now = hereabouts_ipam::clock::now();
    let plan = relayout::plan(&pools, now, args.settle);
    for name in &plan.unsettled {
        println!("wait: {name} is younger than {:?}; its replaced pools' entries move after", args.settle);
    }
    for m in &plan.moves {
        println!("move: {} ({}) from {} to {}", m.ip, m.entry.podref, m.from, m.to);
    }
    for (pool, ip, podref) in &plan.stranded {
        println!("stays: {ip} ({podref}) in {pool}: the new range does not hold it; it goes when its pod does");
    }
    if plan.moves.is_empty() && plan.unsettled.is_empty() && plan.stranded.is_empty() {
        println!("nothing to migrate: no pool replaces another");
        return Ok(true);
    }
    if !args.apply {
        println!("{} to move, {} to stay; --apply moves them", plan.moves.len(), plan.stranded.len());
        return Ok(true);
    }
    let moved = relayout::move_replaced(&store, &pools, now, args.settle).await;
    let retired = retire::retire_replaced(&store, &store.list_pools().await?, now, args.settle)
        .await
        .context("retire the emptied pools")?;
    println!(
        "moved {}, not moved {} (read again on the next run), {retired} emptied pools retired",
        moved.moved, moved.skipped
    );
    Ok(moved.skipped == 0)
}
