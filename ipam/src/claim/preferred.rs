//! The soft preferred address (the maintained Whereabouts fork's `preferred-ip`): a pod annotated with
//! `whereabouts.cni.cncf.io/preferred-ip: <address>` gets that address from the range that contains it when it is
//! free, and the usual choice otherwise (held, excluded, cooling, or in no range). A preference, never a failure: a
//! value that is not an address is ignored with a log line. Read only for a config with `preferred_ip_annotation`.

use std::net::IpAddr;

use crate::budget::Budget;
use crate::config::IpamConfig;
use crate::error::IpamError;
use crate::store::CoreStore;

/// The pod annotation naming the preferred address (the fork's key).
pub const PREFERRED_IP_ANNOTATION: &str = "whereabouts.cni.cncf.io/preferred-ip";

/// The address the annotation `value` prefers, if it is one (a bare address, as the fork reads it).
pub fn preferred_in(value: &str) -> Option<IpAddr> {
    value.trim().parse().ok()
}

/// The address `cfg`'s pod prefers, read from the pod when `enabled`.
pub(crate) async fn preferred_ip(
    store: &impl CoreStore,
    cfg: &IpamConfig,
    enabled: bool,
    pod: &super::choose::PodOnce,
    budget: &Budget,
) -> Result<Option<IpAddr>, IpamError> {
    if !enabled {
        return Ok(None);
    }
    let meta = pod.get(store, cfg, budget, super::choose::refused_read).await?;
    let Some(value) = meta.and_then(|m| m.annotations.as_ref()?.get(PREFERRED_IP_ANNOTATION).cloned()) else {
        return Ok(None);
    };
    let preferred = preferred_in(&value);
    if preferred.is_none() {
        tracing::debug!(annotation = PREFERRED_IP_ANNOTATION, %value, "not an address: ignored");
    }
    Ok(preferred)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_names_one_bare_address() {
        assert_eq!(preferred_in("198.18.0.7"), Some("198.18.0.7".parse().unwrap()));
        assert_eq!(preferred_in(" 2001:db8::7 "), Some("2001:db8::7".parse().unwrap()));
        assert_eq!(preferred_in("198.18.0.7/24"), None, "a prefix is not an address, as the fork reads it");
        assert_eq!(preferred_in("banana"), None);
    }
}
