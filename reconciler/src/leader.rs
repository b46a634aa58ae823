//! Leader election on a coordination.k8s.io Lease: one instance of the DaemonSet runs the cluster-wide reconcile.
//! Taking or renewing the Lease is a replace with the resourceVersion read, so two instances cannot both win.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

/// How long a Lease stays valid without renewal, and how often the holder renews it.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_EVERY: Duration = Duration::from_secs(3);

/// Whether this instance holds the Lease right now.
#[derive(Debug, Clone, Default)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Keeps trying to take, then keep, the Lease `name` in `api`'s namespace as `identity`, until `shutdown`; then
/// gives it up so another instance need not wait for it to expire.
pub async fn run(api: Api<Lease>, name: String, identity: String, leadership: Leadership, shutdown: CancellationToken) {
    loop {
        let held = match try_hold(&api, &name, &identity).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "lease update failed");
                false
            }
        };
        if held != leadership.is_leader() {
            tracing::info!(lease = %name, %identity, leader = held, "leadership changed");
        }
        leadership.0.store(held, Ordering::Release);
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
    }
    if leadership.is_leader() {
        leadership.0.store(false, Ordering::Release);
        if let Err(e) = release(&api, &name, &identity).await {
            tracing::warn!(lease = %name, error = %e, "giving up the lease failed");
        }
    }
}

fn spec(identity: &str, now: Timestamp, acquired: Option<MicroTime>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
        acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(MicroTime(renewed)) = spec.renew_time else { return true };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    renewed + duration < now
}

async fn try_hold(api: &Api<Lease>, name: &str, identity: &str) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let Some(mut lease) = api.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: Some(spec(identity, now, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        };
    };
    let current = lease.spec.clone().unwrap_or_default();
    let ours = current.holder_identity.as_deref() == Some(identity);
    if !ours && !expired(&current, now) && current.holder_identity.as_deref().is_some_and(|h| !h.is_empty()) {
        return Ok(false);
    }
    let acquired = if ours { current.acquire_time.clone() } else { None };
    lease.spec = Some(spec(identity, now, acquired));
    // the resourceVersion read above makes this a compare-and-swap
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, name: &str, identity: &str) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(name).await? else { return Ok(()) };
    let Some(spec) = lease.spec.as_mut().filter(|s| s.holder_identity.as_deref() == Some(identity)) else {
        return Ok(());
    };
    spec.holder_identity = None;
    spec.renew_time = None;
    api.replace(name, &PostParams::default(), &lease).await.map(drop)
}
