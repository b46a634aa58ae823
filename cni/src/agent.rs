//! The node agent's wire: the CNI binary hands its invocation (the CNI environment and stdin) to the agent on the
//! node's unix socket and prints the agent's answer; when no agent answers, it does the work itself.
//!
//! One connection per invocation, two newline-terminated JSON lines each way:
//! the binary writes a [`Handed`]; the agent answers an [`Accepted`] at once (`accepted: false`, the agent does
//! not serve this config: the routing table, host routes, a provider) and, once accepted, an [`Answer`] when
//! the verb is done. The binary does the work itself when the socket is absent or refuses, when no `Accepted`
//! comes within [`ACCEPT_TIMEOUT`], when it is `false`, and when the connection ends without an `Answer` (the
//! agent died or was replaced mid-invocation). Doing it again is safe: both paths write only through the same
//! guarded patches and take the same host lock, and a repeated ADD finds the entry the first one wrote.

use std::collections::BTreeMap;
use std::io::{BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the agent listens on the host.
pub const DEFAULT_SOCKET: &str = "/run/hereabouts/agent.sock";

/// The environment variable that names another socket; set and empty, the agent is never asked.
pub const SOCKET_ENV: &str = "HEREABOUTS_AGENT_SOCKET";

/// How long the binary waits for the agent to accept an invocation before doing the work itself. An agent that
/// is alive accepts at once: this only bounds what a stuck or overloaded one costs an ADD.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_millis(250);

/// The CNI environment variables handed to the agent.
pub const HANDED_VARIABLES: [&str; 7] =
    ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS", "CNI_NETNS", "CNI_PATH", "NODENAME"];

/// The longest a request line may be: a network config with room to spare.
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// An invocation as the binary hands it over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handed {
    /// The variables of [`HANDED_VARIABLES`] that are set.
    pub env: BTreeMap<String, String>,
    /// The network config, as the runtime wrote it.
    pub stdin: String,
}

/// The agent's first line: whether it does this invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub accepted: bool,
    /// Why not, for the binary's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The agent's second line: what the binary prints, and whether it exits 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub stdout: Option<String>,
    pub ok: bool,
}

/// The socket to ask: [`SOCKET_ENV`] when set (`None` when set empty), else [`DEFAULT_SOCKET`].
pub fn socket(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match var(SOCKET_ENV) {
        Some(path) if path.trim().is_empty() => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(DEFAULT_SOCKET)),
    }
}

/// What became of asking the agent.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// The agent did the invocation.
    Answered(Answer),
    /// Nobody did it: the binary does it itself. Why, for stderr.
    NotDone(String),
}

/// Hands the invocation to the agent at `socket` and waits for its answer for at most `answer_within` once it
/// accepted.
pub fn ask(socket: &Path, handed: &Handed, answer_within: Duration) -> Asked {
    match try_ask(socket, handed, answer_within) {
        Ok(asked) => asked,
        Err(e) => Asked::NotDone(format!("agent at {}: {e}", socket.display())),
    }
}

fn try_ask(socket: &Path, handed: &Handed, answer_within: Duration) -> std::io::Result<Asked> {
    let stream = UnixStream::connect(socket)?;
    stream.set_write_timeout(Some(ACCEPT_TIMEOUT))?;
    stream.set_read_timeout(Some(ACCEPT_TIMEOUT))?;
    let mut line = serde_json::to_vec(handed)?;
    line.push(b'\n');
    (&stream).write_all(&line)?;
    let mut reader = BufReader::new(&stream);
    let accepted: Accepted = match read_line(&mut reader)? {
        Some(text) => serde_json::from_str(&text)?,
        None => return Ok(Asked::NotDone("closed before accepting".into())),
    };
    if !accepted.accepted {
        return Ok(Asked::NotDone(accepted.reason.unwrap_or_else(|| "not accepted".into())));
    }
    stream.set_read_timeout(Some(answer_within))?;
    match read_line(&mut reader)? {
        Some(text) => Ok(Asked::Answered(serde_json::from_str(&text)?)),
        None => Ok(Asked::NotDone("the agent went away before answering".into())),
    }
}

fn read_line(reader: &mut impl std::io::BufRead) -> std::io::Result<Option<String>> {
    let mut text = String::new();
    let read = reader.read_line(&mut text)?;
    Ok((read > 0 && text.ends_with('\n')).then_some(text))
}

/// The longest an accepted invocation waits in the agent for the one before it of the same attachment (container
/// and interface) to end; past it, the agent answers "try again later".
pub const TURN_AT_MOST: Duration = Duration::from_secs(5);

/// How long the binary waits for the answer of an accepted invocation: all the agent may take over it — the wait
/// for the attachment's turn ([`TURN_AT_MOST`]), the config's own budget (`ipam.timeout_seconds`), and the
/// roll-back of a failed ADD beyond it ([`hereabouts_ipam::claim::ROLLBACK_GRACE`]) — and 5 s more. A binary that
/// gave up sooner would do the invocation itself while the agent still did it, or rolled it back. The runtime's
/// own timeout is the last word.
pub fn answer_within(stdin: &[u8]) -> Duration {
    let budget = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("ipam")?.get("timeout_seconds")?.as_u64())
        .map_or(hereabouts_ipam::config::DEFAULT_TIMEOUT, Duration::from_secs);
    TURN_AT_MOST + budget + hereabouts_ipam::claim::ROLLBACK_GRACE + Duration::from_secs(5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead as _;

    /// S9 of the fourth review: the binary waited the budget and 5 s, while the agent's ADD may take its turn's
    /// wait, the budget and the roll-back's 5 s beyond it: the binary's fallback then ran beside the agent's roll-back
    /// of the same container. It waits for all of it now, with a margin.
    #[test]
    fn the_binary_waits_longer_than_the_agent_may_take() {
        for (stdin, budget) in [
            (br#"{"ipam":{"timeout_seconds":30}}"#.as_slice(), Duration::from_secs(30)),
            (b"{}".as_slice(), hereabouts_ipam::config::DEFAULT_TIMEOUT),
        ] {
            let agent_at_most = TURN_AT_MOST + budget + hereabouts_ipam::claim::ROLLBACK_GRACE;
            let waits = answer_within(stdin);
            assert!(waits >= agent_at_most + Duration::from_secs(5), "{waits:?} for {agent_at_most:?}");
        }
    }
    use std::os::unix::net::UnixListener;

    fn handed() -> Handed {
        Handed { env: [("CNI_COMMAND".to_string(), "ADD".to_string())].into(), stdin: "{}".into() }
    }

    /// A peer on a socket of the test's own that runs `peer` on the one connection it takes.
    fn peer(peer: impl FnOnce(UnixStream) + Send + 'static) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            peer(stream);
        });
        (dir, path)
    }

    fn read_request(stream: &UnixStream) -> Handed {
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[test]
    fn the_answer_of_an_agent_that_accepted_is_printed() {
        let (_dir, path) = peer(|mut s| {
            assert_eq!(read_request(&s), handed());
            s.write_all(b"{\"accepted\":true}\n{\"stdout\":\"{}\",\"ok\":true}\n").unwrap();
        });
        let asked = ask(&path, &handed(), Duration::from_secs(5));
        assert_eq!(asked, Asked::Answered(Answer { stdout: Some("{}".into()), ok: true }));
    }

    #[test]
    fn no_socket_a_refusal_a_silent_peer_or_a_peer_gone_mid_way_leaves_the_work_to_the_binary() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(ask(&dir.path().join("none"), &handed(), Duration::from_secs(1)), Asked::NotDone(_)));

        let (_d1, declines) = peer(|mut s| {
            read_request(&s);
            s.write_all(b"{\"accepted\":false,\"reason\":\"routing table\"}\n").unwrap();
        });
        assert_eq!(ask(&declines, &handed(), Duration::from_secs(1)), Asked::NotDone("routing table".into()));

        // accepts the connection, never says a word: given up after ACCEPT_TIMEOUT, not the answer's wait
        let (_d2, silent) = peer(|s| {
            std::thread::sleep(Duration::from_secs(3));
            drop(s);
        });
        let started = std::time::Instant::now();
        assert!(matches!(ask(&silent, &handed(), Duration::from_secs(60)), Asked::NotDone(_)));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());

        let (_d3, dies) = peer(|mut s| {
            read_request(&s);
            s.write_all(b"{\"accepted\":true}\n{\"stdout\":").unwrap();
        });
        assert!(matches!(ask(&dies, &handed(), Duration::from_secs(5)), Asked::NotDone(_)), "half an answer");
    }

    #[test]
    fn the_socket_is_the_default_unless_named_and_none_when_named_empty() {
        assert_eq!(socket(|_| None), Some(PathBuf::from(DEFAULT_SOCKET)));
        assert_eq!(socket(|_| Some("/tmp/a.sock".into())), Some(PathBuf::from("/tmp/a.sock")));
        assert_eq!(socket(|_| Some(String::new())), None);
    }

    #[test]
    fn the_answer_waits_for_the_configs_budget() {
        assert_eq!(answer_within(br#"{"ipam":{"timeout_seconds":7}}"#), Duration::from_secs(5 + 7 + 5 + 5));
        let default = hereabouts_ipam::config::DEFAULT_TIMEOUT;
        assert_eq!(answer_within(b"not json"), default + Duration::from_secs(15));
    }
}
