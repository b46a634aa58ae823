//! Keeping the CNI token fresh until SIGTERM or SIGINT.
//!
//! Every `--watch-interval` the token and CA files are read and compared with the last read. The kubelet rotates a
//! projected token by swapping a `..data` symlink in the volume, which file-level inotify does not follow;
//! comparing the content of two small files every few seconds is cheap and cannot miss a change. A file of the
//! three that someone removed is put back on the same poll.
//!
//! A new token is minted when the last one has used up its refresh fraction, when this pod's token or the CA
//! changed, and after a failed attempt, with exponential backoff. A failed mint changes nothing on the host: the
//! kubeconfig keeps the last token, which is bound to the Node, not to a pod, and stays valid until its expiry or
//! until the Node is gone. A Node deleted and registered again under the same name has a new UID, which the last
//! token does not name: the kubelet's next rotation of this pod's token (within the hour) makes a mint due.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::render::Credentials;
use super::token::{MintError, Minted};
use super::{Installer, Stop, blocking};

/// Backoff between failed mints: 1 s, doubling up to 30 s, each with up to as much again of jitter, so that the
/// nodes of a cluster whose API server comes back do not all ask at the same moment.
fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(30))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// What the loop knows.
struct State {
    /// This pod's token and CA as last read.
    pod: Credentials,
    /// What the kubeconfig holds, once this process has written it.
    cni: Option<Credentials>,
    /// When the next mint is due.
    due: Instant,
    backoff: ExponentialBackoff,
    /// Failed mints since the last success.
    failed: u32,
    /// The last mint failure and the last file failure: a failure that persists is logged once, not every try.
    mint_failure: Option<String>,
    file_failure: Option<String>,
}

impl State {
    fn minted(&mut self, minted: &Minted, cni: Credentials) {
        if self.failed > 0 {
            info!(failed_attempts = self.failed, "minted the CNI plugin's token again");
        }
        info!(expires = %minted.expires, refresh_in = ?minted.refresh_after, "minted the CNI plugin's token");
        self.cni = Some(cni);
        self.due = Instant::now() + minted.refresh_after;
        self.backoff = backoff();
        self.failed = 0;
        self.mint_failure = None;
    }

    fn mint_failed(&mut self, error: &MintError) {
        self.failed += 1;
        let delay = self.backoff.next().unwrap_or(Duration::from_secs(30));
        self.due = Instant::now() + delay;
        let message = crate::error_chain(error);
        if self.mint_failure.as_deref() != Some(message.as_str()) {
            warn!(error = %message, kept = self.cni.is_some(),
                "cannot mint the CNI plugin's token; the kubeconfig keeps its last token; retrying with backoff");
            self.mint_failure = Some(message);
        }
    }

    /// Takes in a fresh read of the files: a new pod token or CA makes a mint due now, with a fresh backoff.
    fn polled(&mut self, pod: Credentials) {
        let token = pod.token != self.pod.token;
        let ca = pod.ca != self.pod.ca;
        if token || ca {
            info!(token_rotated = token, ca_changed = ca, "this pod's credentials changed; minting a new token");
            self.due = Instant::now();
            self.backoff = backoff();
        }
        self.pod = pod;
        if self.file_failure.take().is_some() {
            info!("the token and CA files can be read again");
        }
    }

    fn file_failed(&mut self, error: &anyhow::Error, interval: Duration) {
        let message = format!("{error:#}");
        if self.file_failure.as_deref() != Some(message.as_str()) {
            warn!(error = %message, "cannot read or restore the files; retrying every {interval:?}");
            self.file_failure = Some(message);
        }
    }
}

/// Writes what `first` (the start-up mint) gave, then polls every `interval` and mints when due, until a signal.
pub(super) async fn watch(
    installer: Arc<Installer>,
    pod: Credentials,
    first: Result<Minted, MintError>,
    interval: Duration,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut state = State {
        pod,
        cni: None,
        due: Instant::now(),
        backoff: backoff(),
        failed: 0,
        mint_failure: None,
        file_failure: None,
    };
    let cni = match &first {
        Ok(minted) => Some(Credentials { token: minted.token.clone(), ca: state.pod.ca.clone() }),
        Err(e) => {
            state.mint_failed(e);
            None
        }
    };
    {
        let (installer, cni) = (installer.clone(), cni.clone());
        blocking(move || installer.install(cni.as_ref())).await?;
    }
    if let (Ok(minted), Some(cni)) = (&first, cni) {
        state.minted(minted, cni);
    }

    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            name = stop.recv() => {
                info!(signal = name, "stopping");
                return Ok(());
            }
            _ = ticker.tick() => {}
        }
        let (i, mut cni) = (installer.clone(), state.cni.clone());
        match blocking(move || i.poll(&mut cni).map(|pod| (pod, cni))).await {
            Ok((pod, cni)) => {
                state.cni = cni;
                state.polled(pod);
            }
            Err(e) => state.file_failed(&e, interval),
        }
        if Instant::now() < state.due {
            continue;
        }
        let pod = state.pod.clone();
        let minted = tokio::select! {
            minted = installer.minter.mint(&pod) => minted,
            name = stop.recv() => {
                info!(signal = name, "stopping");
                return Ok(());
            }
        };
        match minted {
            Ok(minted) => {
                let cni = Credentials { token: minted.token.clone(), ca: pod.ca };
                let (i, written) = (installer.clone(), cni.clone());
                match blocking(move || i.store(&written)).await {
                    Ok(()) => state.minted(&minted, cni),
                    // the token is good but is not on the host: try again at the next poll
                    Err(e) => state.file_failed(&e, interval),
                }
            }
            Err(e) => state.mint_failed(&e),
        }
    }
}
