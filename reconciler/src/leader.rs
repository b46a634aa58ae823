//! Leader election on a coordination.k8s.io Lease: one instance of the DaemonSet runs the cluster-wide reconcile.
//! Taking or renewing the Lease is a replace with the resourceVersion read, so two instances cannot both win.
//!
//! The Lease is created by `deploy/daemonset.yaml`, and the DaemonSet's ServiceAccount may only `get` and
//! `update` it by name: RBAC cannot limit `create` to one name, and a right to create any Lease would let a
//! stolen token forge other components' leader leases. A missing Lease is still created when the identity may
//! (a test cluster, an admin's kubeconfig); when it may not, that is said once, clearly, and retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use prometheus_client::metrics::counter::Counter;
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

    /// The leader's periodic work: waits `every` (again and again while this instance does not lead), then says
    /// whether to make a pass now (`true`) or stop (`false`, at `shutdown`).
    pub async fn next_turn(&self, every: Duration, shutdown: &CancellationToken) -> bool {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(every) => {}
            }
            if self.is_leader() {
                return true;
            }
        }
    }
}

/// Why the Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
enum HoldError {
    #[error("read the lease")]
    Get(#[source] kube::Error),
    /// The Lease does not exist and this identity may not create it.
    #[error(
        "the lease does not exist and this identity may not create it (403): apply the Lease of \
         deploy/daemonset.yaml; the ServiceAccount may only get and update it by name"
    )]
    CreateForbidden(#[source] kube::Error),
    #[error("create the lease")]
    Create(#[source] kube::Error),
    #[error("update the lease")]
    Update(#[source] kube::Error),
}

/// Keeps trying to take, then keep, the Lease `name` in `api`'s namespace as `identity`, until `shutdown`; then
/// gives it up so another instance need not wait for it to expire. A failure is logged when it first happens
/// (or changes), not on every try; `failures` counts every one.
pub async fn run(
    api: Api<Lease>,
    name: String,
    identity: String,
    leadership: Leadership,
    failures: Counter,
    shutdown: CancellationToken,
) {
    let mut failing: Option<String> = None;
    loop {
        let held = match try_hold(&api, &name, &identity).await {
            Ok(held) => {
                if failing.take().is_some() {
                    tracing::info!(lease = %name, "the lease can be read and written again");
                }
                held
            }
            Err(e) => {
                failures.inc();
                let message = crate::error_chain(&e);
                if failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(lease = %name, error = %message, "cannot hold the lease; retrying every {RENEW_EVERY:?}");
                    failing = Some(message);
                }
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

async fn try_hold(api: &Api<Lease>, name: &str, identity: &str) -> Result<bool, HoldError> {
    let now = Timestamp::now();
    let Some(mut lease) = api.get_opt(name).await.map_err(HoldError::Get)? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: Some(spec(identity, now, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(kube::Error::Api(s)) if s.code == 403 => Err(HoldError::CreateForbidden(kube::Error::Api(s))),
            Err(e) => Err(HoldError::Create(e)),
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
        Err(e) => Err(HoldError::Update(e)),
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
