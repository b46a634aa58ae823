//! Persistent addresses for VMs: an attachment whose network selection element names an IPAMClaim
//! (`ipam-claim-reference`, as KubeVirt writes it for a network whose config has `allowPersistentIPs`) gets the
//! claim's addresses, whichever pod of the claim asks. The addresses recorded in the claim's status are asked for
//! exactly; a claim without any gets the usual choice, recorded on it once the ADD holds them. The pool entry and the
//! reservation record the claim, so the next pod of the claim (the target of a live migration, while the source
//! still runs; the VM restarted) takes them over as an earlier sandbox's, DEL and GC leave them, and the reconciler
//! gives them back only once the claim is gone.
//!
//! Multus does not hand the claim reference to the IPAM plugin: it is read from the pod's
//! `k8s.v1.cni.cncf.io/networks` annotation (or from `args.cni`, where an element's `cni-args` arrive).

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use super::choose::{IPAMCLAIMS_CLUSTER_ROLE, IPAMCLAIMS_VALUE};
use crate::budget::Budget;
use crate::config::{IpamConfig, PersistentIps};
use crate::crd::{IpamClaim, IpamClaimStatus, OwnerPod};
use crate::error::IpamError;
use crate::request::Assigned;
use crate::store::{CoreStore, IpamClaimStore, Patched, StoreError};

/// The pod annotation holding the network selection elements (Multus).
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// The IPAMClaim the network selection elements in `annotation` name for the interface `ifname`: the element whose
/// `interface` is `ifname` or, one without, whose place in the list gives Multus' default name (`net1` for the
/// first). A list in the short form (`a,b@eth1`) names no claim.
pub fn reference_in(annotation: &str, ifname: &str) -> Option<String> {
    let Ok(Value::Array(elements)) = serde_json::from_str::<Value>(annotation.trim()) else { return None };
    elements.iter().enumerate().find_map(|(index, element)| {
        let interface = match element.get("interface").and_then(Value::as_str).filter(|i| !i.is_empty()) {
            Some(named) => named.to_string(),
            None => format!("net{}", index + 1),
        };
        let claim = element.get("ipam-claim-reference").and_then(Value::as_str).filter(|c| !c.is_empty());
        (interface == ifname).then(|| claim.map(str::to_string)).flatten()
    })
}

/// The IPAMClaim an ADD of `cfg`'s pod on interface `ifname` uses, as read now.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRead {
    /// Its name (in the pod's namespace).
    pub name: String,
    /// `namespace/name`, for messages.
    pub what: String,
    /// The claim as read: its status is written guarded on this version.
    pub claim: IpamClaim,
    /// The addresses its status records.
    pub ips: Vec<IpAddr>,
}

/// The IPAMClaim of this attachment, if its network allows persistent IPs and the runtime or the pod names one:
/// read, and checked to be this network's.
pub(crate) async fn resolve(
    store: &(impl CoreStore + IpamClaimStore),
    cfg: &IpamConfig,
    persistent: &PersistentIps,
    ifname: &str,
    pod: &super::choose::PodOnce,
    budget: &Budget,
) -> Result<Option<ClaimRead>, IpamError> {
    if !persistent.allowed {
        return Ok(None);
    }
    let namespace = &cfg.pod.namespace;
    let name = match &persistent.reference {
        Some(name) => name.clone(),
        None => {
            let meta = pod.get(store, cfg, budget, rights).await?;
            let annotation = meta.and_then(|m| m.annotations.as_ref()?.get(NETWORKS_ANNOTATION).cloned());
            match annotation.and_then(|a| reference_in(&a, ifname)) {
                Some(name) => name,
                None => return Ok(None),
            }
        }
    };
    let what = format!("{namespace}/{name}");
    let claim = budget
        .retry(StoreError::is_transient, || store.get_ipamclaim(namespace, &name))
        .await
        .map_err(|e| rights(&format!("ipamclaim {what}: get"), e))?
        .ok_or_else(|| IpamError::ClaimMissing { claim: what.clone() })?;
    if claim.spec.network != cfg.name {
        return Err(IpamError::ClaimUnusable {
            claim: what,
            reason: format!("it is for network {:?}, this attachment's is {:?}", claim.spec.network, cfg.name),
        });
    }
    let ips = recorded(&claim).map_err(|reason| IpamError::ClaimUnusable { claim: what.clone(), reason })?;
    tracing::debug!(claim = %what, ips = ?ips, "IPAMClaim read");
    Ok(Some(ClaimRead { name, what, claim, ips }))
}

/// The addresses the claim's status records (`address/prefix`, as OVN-Kubernetes writes them, or bare).
fn recorded(claim: &IpamClaim) -> Result<Vec<IpAddr>, String> {
    let listed = claim.status.as_ref().map(|s| s.ips.as_slice()).unwrap_or_default();
    listed
        .iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map(|n| n.addr())
                .or_else(|_| s.parse::<IpAddr>())
                .map_err(|_| format!("status.ips holds {s:?}, not an address"))
        })
        .collect()
}

impl ClaimRead {
    /// `cfg` asking for the claim's addresses: each in the range that holds it. A recorded address that no range
    /// holds (the network's ranges moved away from it) cannot be kept, and is said so.
    pub fn asking(&self, cfg: &IpamConfig) -> Result<IpamConfig, IpamError> {
        let mut asked = cfg.clone();
        for ip in &self.ips {
            if !cfg.ranges.iter().any(|r| r.cidr().contains(ip)) {
                return Err(IpamError::ClaimUnusable {
                    claim: self.what.clone(),
                    reason: format!(
                        "it holds {ip}, which no range of network {:?} contains now; delete the claim (its VM) to \
                         give it a new address",
                        cfg.name
                    ),
                });
            }
            if !asked.requested.contains(ip) {
                asked.requested.push(*ip);
            }
        }
        Ok(asked)
    }

    /// Records `assigned` and the pod `pod` on the claim, guarded on the version read: done when the claim already
    /// says so. Another pod of the claim that recorded other addresses meanwhile wins ([`IpamError::ClaimConflict`]:
    /// the caller gives this ADD's back). A write without an answer is read back.
    pub async fn record(
        &self,
        store: &impl IpamClaimStore,
        assigned: &[Assigned],
        pod: &str,
        budget: &Budget,
    ) -> Result<(), IpamError> {
        let status = IpamClaimStatus {
            ips: assigned.iter().map(|a| format!("{}/{}", a.ip, a.prefix_len)).collect(),
            owner_pod: Some(OwnerPod { name: pod.to_string() }),
        };
        let mut current = self.claim.clone();
        let mut attempt = 0;
        loop {
            budget
                .pause(attempt)
                .await
                .map_err(|_| IpamError::Expired(format!("ipamclaim {}: write status", self.what)))?;
            attempt += 1;
            let held = recorded(&current).unwrap_or_default();
            let owner = current.status.as_ref().and_then(|s| s.owner_pod.as_ref()).map(|o| o.name.as_str());
            let same = |a: &[IpAddr], b: &[IpAddr]| a.len() == b.len() && a.iter().all(|ip| b.contains(ip));
            let mine: Vec<IpAddr> = assigned.iter().map(|a| a.ip).collect();
            if !held.is_empty() && !held.iter().all(|ip| mine.contains(ip)) {
                return Err(IpamError::ClaimConflict {
                    claim: self.what.clone(),
                    holds: held.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                });
            }
            if same(&held, &mine) && owner == Some(pod) {
                return Ok(());
            }
            let written =
                budget.retry(StoreError::is_transient, || store.set_ipamclaim_status(&current, &status)).await;
            match written {
                Ok(Patched::Applied) => {
                    tracing::info!(claim = %self.what, ips = ?status.ips, pod, "recorded on the IPAMClaim");
                    return Ok(());
                }
                Ok(Patched::Missing) => return Err(IpamError::ClaimMissing { claim: self.what.clone() }),
                // changed since read, or an earlier try applied without its answer: read it again
                Ok(Patched::Refused(_)) => {}
                Err(e) => return Err(rights(&format!("ipamclaim {}: write status", self.what), e)),
            }
            let namespace = current.metadata.namespace.clone().unwrap_or_default();
            current = budget
                .retry(StoreError::is_transient, || store.get_ipamclaim(&namespace, &self.name))
                .await
                .map_err(|e| rights(&format!("ipamclaim {}: get", self.what), e))?
                .ok_or_else(|| IpamError::ClaimMissing { claim: self.what.clone() })?;
        }
    }
}

/// The failure of a request `what`, saying which grant a refusal (403) wants.
fn rights(what: &str, err: crate::budget::RetryError<StoreError>) -> IpamError {
    match IpamError::from_retry(what, err) {
        IpamError::Store(e) if e.status_code() == Some(403) => IpamError::Refused {
            what: what.to_string(),
            message: format!(
                "{}; a network with allowPersistentIPs reads pods and IPAMClaims and writes their status: bind the \
                 CNI's ServiceAccount to the ClusterRole {IPAMCLAIMS_CLUSTER_ROLE} (the chart's value \
                 {IPAMCLAIMS_VALUE})",
                e.message
            ),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_element_of_this_interface_names_the_claim() {
        let nse = r#"[
            {"name": "blue", "ipam-claim-reference": "vm1.blue"},
            {"name": "red", "namespace": "ns", "interface": "pod16367aacb67", "ipam-claim-reference": "vm1.red"},
            {"name": "green"}
        ]"#;
        assert_eq!(reference_in(nse, "net1").as_deref(), Some("vm1.blue"), "the first, by Multus' default name");
        assert_eq!(reference_in(nse, "pod16367aacb67").as_deref(), Some("vm1.red"), "by its interface");
        assert_eq!(reference_in(nse, "net2"), None, "the second element names its interface: net2 is not it");
        assert_eq!(reference_in(nse, "net3"), None, "an element without a claim");
        assert_eq!(reference_in(nse, "eth0"), None);
        assert_eq!(reference_in("blue,red@net2", "net1"), None, "the short form names no claim");
        assert_eq!(reference_in("not json [", "net1"), None);
    }

    #[test]
    fn a_claims_status_is_read_with_or_without_prefixes() {
        let mut claim = IpamClaim::new("c", Default::default());
        claim.status =
            Some(IpamClaimStatus { ips: vec!["198.18.0.5/24".into(), "2001:db8::5".into()], owner_pod: None });
        assert_eq!(
            recorded(&claim).unwrap(),
            ["198.18.0.5".parse::<IpAddr>().unwrap(), "2001:db8::5".parse().unwrap()]
        );
        claim.status = Some(IpamClaimStatus { ips: vec!["nonsense".into()], owner_pod: None });
        assert!(recorded(&claim).unwrap_err().contains("nonsense"));
    }
}
