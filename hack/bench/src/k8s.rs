//! The harness's own API calls: reads retried past a storage hiccup, names, and pre-filled objects written as
//! the plugins would have written them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use hereabouts_ipam::crd::{
    IpAllocation, IpPool, IpPoolSpec, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, NodeSlicePoolStatus,
};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// The harness's own reads, retried a few times (a 429 while storage re-initialises is not the plugins' fault).
pub async fn retry<T, F, Fut>(f: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut last = None;
    for _ in 0..20 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow::anyhow!("no attempt")))
}

/// The IPPool name both plugins use for `range` (no network name).
pub fn pool_name(range: &str) -> String {
    range.replace(['/', ':'], "-")
}

/// The IPPool name both plugins use for `node`'s slice `range` (no network name).
pub fn slice_pool_name(node: &str, range: &str) -> String {
    format!("{node}-{}", pool_name(range))
}

/// An IPv4 CIDR as its network address and prefix length.
pub fn parse_cidr(cidr: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let (ip, len) = cidr.split_once('/').with_context(|| format!("{cidr} is not a CIDR"))?;
    Ok((ip.parse()?, len.parse()?))
}

/// The slices of prefix `slice` of an IPv4 `range`, lowest first, as both plugins print them.
pub fn slices(range: &str, slice: u8) -> anyhow::Result<Vec<String>> {
    let (net, len) = parse_cidr(range)?;
    anyhow::ensure!(slice >= len && slice <= 32, "/{slice} cannot slice {range}");
    let step = 1u64 << (32 - slice);
    Ok((0..1u64 << (slice - len))
        .map(|i| format!("{}/{slice}", Ipv4Addr::from((u64::from(u32::from(net)) + i * step) as u32)))
        .collect())
}

/// Entries at offsets `1..=count` for pods `<prefix><offset>` of `ns`, in the shape W3's pre-fill has always
/// used (the fields both plugins write).
pub fn fill_entries(ns: &str, prefix: &str, count: usize) -> BTreeMap<String, IpAllocation> {
    (1..=count)
        .map(|off| {
            let pod = format!("{prefix}{off}");
            let entry = IpAllocation {
                id: format!("{pod}-c"),
                podref: format!("{ns}/{pod}"),
                ifname: "net1".into(),
                ..Default::default()
            };
            (off.to_string(), entry)
        })
        .collect()
}

/// Creates IPPools (name, range, entries), 8 at a time.
pub async fn create_pools(
    admin: &Client,
    ns: &str,
    pools: Vec<(String, String, BTreeMap<String, IpAllocation>)>,
) -> anyhow::Result<()> {
    let api = Api::<IpPool>::namespaced(admin.clone(), ns);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(pools)
        .map(|(name, range, allocations)| {
            let api = api.clone();
            async move {
                let pool = IpPool {
                    metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                    spec: IpPoolSpec { range, allocations, ..Default::default() },
                };
                api.create(&PostParams::default(), &pool).await.with_context(|| format!("create pool {name}"))?;
                Ok(())
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Creates the NodeSlicePool `name` of `range` cut into `slice_size` slices, `owners` (slice, node) assigned and
/// every other slice free; the status goes in with the object, as the CRD has no status subresource.
pub async fn create_node_slice_pool(
    admin: &Client,
    ns: &str,
    name: &str,
    range: &str,
    slice_size: &str,
    owners: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let prefix: u8 = slice_size.trim_start_matches('/').parse()?;
    let allocations = slices(range, prefix)?
        .into_iter()
        .map(|s| NodeSliceAllocation { node_name: owners.get(&s).cloned().unwrap_or_default(), slice_range: s })
        .collect();
    let mut object = NodeSlicePool::new(name, NodeSlicePoolSpec { range: range.into(), slice_size: slice_size.into() });
    object.status = Some(NodeSlicePoolStatus { allocations });
    Api::<NodeSlicePool>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("create NodeSlicePool {ns}/{name}"))?;
    Ok(())
}
