//! The release rules, and the guarded writes that follow them: whether an entry or a reservation may be given back
//! ([`rules`], pure and property-tested), what doing so for one entry or reservation involves ([`Releaser`]), and
//! one full pass over a namespace ([`reconcile_once`]), which also retires the empty pools a changed range left
//! behind ([`retire`]). The reconciler DaemonSet runs them on pod events and on its schedule; `kubectl hereabouts` runs the same ones from an operator's machine.

mod cluster;
pub mod relayout;
mod releaser;
pub mod retire;
pub mod rules;
mod sweep;

pub use cluster::{
    Cluster, KubeCluster, MIRROR_ANNOTATION, Notice, is_finished, read_ipamclaim, read_node, read_statefulset, view_of,
};
pub use releaser::{Considered, Releaser, ReservationOutcome, Tally, Views, entries};
pub use sweep::{Summary, reconcile_once};

use std::time::Duration;

/// A duration as the reconciler's flags and `kubectl hereabouts` take it: `60s`, `2m`, `500ms`, `1h`, or plain
/// seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 60s, 2m or 500ms"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        other => Err(format!("unknown unit {other:?} in {text:?} (use ms, s, m or h)")),
    }
}
