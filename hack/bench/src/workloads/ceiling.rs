//! The ceiling: what the API server itself sustains for the writes an ADD makes, with no CNI process and no
//! plugin logic: guarded JSON patches adding one small entry each (the shape of hereabouts' pool write), to one
//! object from many writers or to many objects from one writer each, and small-object creates (the shape of a
//! reservation). A plugin's ADDs/s cannot beat this divided by its writes per ADD.

use std::collections::BTreeMap;
use std::time::Instant;

use hereabouts_ipam::crd::{IpPool, IpPoolSpec, OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::Bench;
use crate::metrics::delta;

#[derive(Debug, Clone, Default)]
pub struct CeilingRow {
    pub label: String,
    pub ops: usize,
    pub failed: usize,
    pub wall: f64,
    /// Latency of each request as this process saw it, ms.
    pub lat: Vec<f64>,
    /// The API server's own time per request of the measured kind, ms.
    pub server_ms: f64,
    pub errors: BTreeMap<String, u64>,
}

impl CeilingRow {
    /// Successful requests per second.
    pub fn per_s(&self) -> f64 {
        (self.ops - self.failed) as f64 / self.wall
    }
}

/// (objects, writers): writer `w` writes to object `w % objects`, one request at a time.
const PATCH_ROWS: [(usize, usize); 5] = [(1, 32), (1, 8), (1, 1), (8, 8), (32, 32)];

/// Label of the one-object, 32-writer row, which the table divides W1's throughput by.
pub const ONE_OBJECT_32: &str = "1 IPPool × 32 writers";
/// Label of the one-object, one-writer row.
pub const ONE_OBJECT_SERIES: &str = "1 IPPool × 1 writer (in series)";
/// Label of the eight-objects row, the shape of W1s (8 nodes, one pool each, one writer per node and pool).
pub const EIGHT_OBJECTS: &str = "8 IPPools × 1 writer each (8 at once)";

impl Bench {
    pub async fn ceiling(&self) -> anyhow::Result<Vec<CeilingRow>> {
        let ns = self.cluster.namespace("ceiling").await;
        let mut rows = Vec::new();
        for (tag, (objects, writers)) in PATCH_ROWS.into_iter().enumerate() {
            let label = match (objects, writers) {
                (1, 1) => ONE_OBJECT_SERIES.to_string(),
                (1, w) => format!("1 IPPool × {w} writers"),
                (o, _) => format!("{o} IPPools × 1 writer each ({o} at once)"),
            };
            let row = self.patches(&ns, tag, objects, writers, label).await?;
            eprintln!("bench: ceiling {}: {:.1}/s, {} failed", row.label, row.per_s(), row.failed);
            rows.push(row);
        }
        let row = self.creates(&ns, 32).await?;
        eprintln!("bench: ceiling {}: {:.1}/s, {} failed", row.label, row.per_s(), row.failed);
        rows.push(row);
        Ok(rows)
    }

    async fn patches(
        &self,
        ns: &str,
        tag: usize,
        objects: usize,
        writers: usize,
        label: String,
    ) -> anyhow::Result<CeilingRow> {
        let api = Api::<IpPool>::namespaced(self.admin.clone(), ns);
        let names: Vec<String> = (0..objects).map(|i| format!("ceiling-{tag}-{i}")).collect();
        for name in &names {
            let pool = IpPool {
                metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                spec: IpPoolSpec { range: "10.0.0.0/8".into(), ..Default::default() },
            };
            api.create(&PostParams::default(), &pool).await?;
        }
        let total = self.sizes.ceiling_ops;
        let before = self.snapshot().await;
        let t0 = Instant::now();
        let per_writer = futures::future::join_all((0..writers).map(|w| {
            let (api, name) = (&api, &names[w % objects]);
            async move {
                let mut outs = Vec::new();
                for j in (w..total).step_by(writers) {
                    let path = format!("/spec/allocations/{}", j + 1);
                    let entry = json!({"id": format!("ceiling-{j}-c"), "podref": format!("{ns}/ceiling-{j}"), "ifname": "net1"});
                    // the test of null passes only while the key is absent, as in hereabouts' own pool write
                    let ops = json!([{"op": "test", "path": path, "value": null}, {"op": "add", "path": path, "value": entry}]);
                    let patch: Patch<()> = Patch::Json(serde_json::from_value(ops).expect("a valid JSON patch"));
                    let t = Instant::now();
                    let out = api.patch(name, &PatchParams::default(), &patch).await.map(drop);
                    outs.push((t.elapsed().as_secs_f64() * 1000.0, out.err().map(|e| error_key(&e))));
                }
                outs
            }
        }))
        .await;
        let wall = t0.elapsed().as_secs_f64();
        let counters = delta(&before, &self.snapshot().await);
        Ok(row(label, wall, per_writer.into_iter().flatten().collect(), &counters, "PATCH ippools"))
    }

    async fn creates(&self, ns: &str, parallel: usize) -> anyhow::Result<CeilingRow> {
        use futures::StreamExt as _;
        let api = Api::<OverlappingRangeIpReservation>::namespaced(self.admin.clone(), ns);
        let before = self.snapshot().await;
        let t0 = Instant::now();
        let outs: Vec<(f64, Option<String>)> = futures::stream::iter(0..self.sizes.ceiling_ops)
            .map(|j| {
                let api = &api;
                async move {
                    let name = format!("198.21.{}.{}", j / 250, j % 250 + 1);
                    let spec = OverlappingRangeIpReservationSpec {
                        containerid: format!("ceiling-{j}-c"),
                        ifname: "net1".into(),
                        podref: format!("{ns}/ceiling-{j}"),
                        ipamclaim: None,
                    };
                    let object = OverlappingRangeIpReservation::new(&name, spec);
                    let t = Instant::now();
                    let out = api.create(&PostParams::default(), &object).await.map(drop);
                    (t.elapsed().as_secs_f64() * 1000.0, out.err().map(|e| error_key(&e)))
                }
            })
            .buffer_unordered(parallel)
            .collect()
            .await;
        let wall = t0.elapsed().as_secs_f64();
        let counters = delta(&before, &self.snapshot().await);
        let label = format!("OverlappingRangeIPReservation creates, {parallel} at once");
        Ok(row(label, wall, outs, &counters, "POST overlappingrangeipreservations"))
    }
}

fn row(
    label: String,
    wall: f64,
    outs: Vec<(f64, Option<String>)>,
    counters: &BTreeMap<String, f64>,
    kind: &str,
) -> CeilingRow {
    let mut r = CeilingRow { label, ops: outs.len(), wall, ..Default::default() };
    for (ms, err) in outs {
        r.lat.push(ms);
        if let Some(e) = err {
            r.failed += 1;
            *r.errors.entry(e).or_default() += 1;
        }
    }
    let n = counters.get(&format!("req {kind}")).copied().unwrap_or(0.0);
    r.server_ms = 1000.0 * counters.get(&format!("srvsec {kind}")).copied().unwrap_or(0.0) / n;
    r
}

fn error_key(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("HTTP {} {}", s.code, s.reason),
        other => other.to_string(),
    }
}
