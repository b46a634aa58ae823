//! The leader checks, when it starts leading and hourly after, that the CRDs installed keep every field hereabouts
//! writes ([`hereabouts_ipam::crd::drift`]): under Whereabouts' or its fork's CRDs the API server silently drops
//! the reuse cooldown's release records, sticky and provider records, and what tells a recreated pod's entry from
//! its predecessor's. A drift is loud: a warning in the log, a Warning Event on the CRD, and the gauge
//! `hereabouts_crd_schema_drift{crd}` (fields pruned, plus one for a status subresource).

use std::time::{Duration, Instant};

use hereabouts_ipam::crd::definitions;
use hereabouts_ipam::crd::drift::{Drift, drift};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::leader::Leadership;
use crate::metrics::CrdLabels;

/// How often the leader checks again.
const EVERY: Duration = Duration::from_secs(3600);

/// Checks while this instance leads: at once when it starts leading, then every hour, until `shutdown`.
pub async fn run(
    client: Client,
    recorder: Recorder,
    gauge: Family<CrdLabels, Gauge>,
    leadership: Leadership,
    shutdown: CancellationToken,
) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut last: Option<Instant> = None;
    while leadership.next_turn(Duration::from_secs(2), &shutdown).await {
        if last.is_some_and(|at| at.elapsed() < EVERY) {
            continue;
        }
        last = Some(Instant::now());
        for (_, ours) in definitions() {
            let name = ours.metadata.name.clone().unwrap_or_default();
            let installed = match api.get_opt(&name).await {
                Ok(Some(installed)) => installed,
                Ok(None) => {
                    tracing::warn!(crd = %name, "CRD not installed: apply hereabouts' CRDs (kubectl apply -f crds/)");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(crd = %name, error = %crate::error_chain(&e),
                        "cannot read the CRD to check its schema (get customresourcedefinitions)");
                    continue;
                }
            };
            let found = drift(&ours, &installed);
            let fields = found.pruned.len() + usize::from(found.status_subresource);
            gauge.get_or_create(&CrdLabels { crd: name.clone() }).set(i64::try_from(fields).unwrap_or(i64::MAX));
            if found.is_clean() {
                tracing::info!(crd = %name, "the CRD keeps every field hereabouts writes");
            } else {
                report(&recorder, &installed, &found).await;
            }
        }
    }
}

async fn report(recorder: &Recorder, installed: &CustomResourceDefinition, found: &Drift) {
    let note = format!(
        "the installed schema prunes {} ({}): apply hereabouts' CRDs (kubectl apply -f crds/)",
        if found.pruned.is_empty() {
            "nothing, but has a status subresource".to_string()
        } else {
            found.pruned.join(", ")
        },
        found.consequences().join("; ")
    );
    tracing::warn!(crd = %found.crd, pruned = ?found.pruned, status_subresource = found.status_subresource,
        "CRD schema drift: {note}");
    let reference = ObjectReference {
        api_version: Some("apiextensions.k8s.io/v1".into()),
        kind: Some("CustomResourceDefinition".into()),
        name: installed.metadata.name.clone(),
        uid: installed.metadata.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "SchemaDrift".into(),
        note: Some(note),
        action: "CheckSchema".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::debug!(crd = %found.crd, error = %e, "publishing the event failed");
    }
}
