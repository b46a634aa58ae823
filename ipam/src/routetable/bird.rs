//! Whether the routing daemon has given this node every other node's claims: BIRD 2, asked over its control
//! socket (docs/routetable.md, "The readiness gate").
//!
//! A node learns another node's claims only over BGP. While a session is down, or up but still exchanging its
//! initial routes, the claims of the nodes behind it are missing from this node's table, and an ADD would take for
//! free an address another node's pod holds. So an ADD asks first and answers "try again later" until every BGP
//! session BIRD has is established and its initial exchange done.
//!
//! **What BIRD shows of "initial exchange done".** BIRD 2.0.12 tracks the End-of-RIB it receives on each channel
//! (`load_state` in `proto/bgp`) but prints it nowhere. It shows it in two places only, both with graceful restart:
//! a node restarting with `bird -R` is in *graceful restart recovery* (`show status`, reply 0024) until every peer
//! has sent its End-of-RIB; a peer that restarted is listed with `Neighbor graceful restart active` until its
//! End-of-RIB arrives on the new session. Where neither applies (a first start, a session reset by
//! `birdc disable`/`enable` or a notification, a peer that restarted without `-R`, whose routes BIRD drops as the
//! new session opens) the peer's whole table and its End-of-RIB follow the session's establishment at once, and
//! the only bound BIRD offers is the time since (`Since` of `show protocols`, read against `show status`'s server
//! time, both in BIRD's clock and time zone): a session counts once it has been established for `bird_settle_ms`.
//!
//! The wire protocol is BIRD's (`nest/cli.c`, `doc/reply_codes`): one command per line; a reply is lines of a
//! four-digit code and `-` (more follows) or ` ` (the last line), a line starting with a space continues the code
//! before it, one starting with `+` is a spontaneous message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;

/// How long one conversation with BIRD may take: it answers from memory within milliseconds; a daemon that does
/// not is as good as absent.
const CONVERSATION: Duration = Duration::from_secs(3);

/// A reply longer than this is not BIRD's answer to our commands.
const MAX_REPLY_LINES: usize = 100_000;

/// Why this node may not claim addresses now, naming what is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the routing daemon is not ready, so other nodes' claims may be missing here: {}", reasons.join("; "))]
pub struct NotReady {
    /// What is not ready, one sentence each (a session, the daemon, the socket).
    pub reasons: Vec<String>,
}

impl NotReady {
    fn one(reason: impl Into<String>) -> Self {
        Self { reasons: vec![reason.into()] }
    }
}

/// The routing daemon of this node, as far as the readiness gate asks it.
pub trait RoutingDaemon {
    /// `Ok` when every peer's session is established and its initial exchange done.
    fn ready(&self) -> impl Future<Output = Result<(), NotReady>> + Send;
}

/// BIRD at its control socket.
#[derive(Debug, Clone)]
pub struct Bird {
    socket: PathBuf,
    settle: Duration,
}

impl Bird {
    /// BIRD listening on `socket`; a session counts as done with its initial exchange `settle` after it was
    /// established (where BIRD shows nothing better).
    pub fn new(socket: &Path, settle: Duration) -> Self {
        Self { socket: socket.to_path_buf(), settle }
    }

    /// Sends each command and returns each reply.
    async fn ask(&self, commands: &[&str]) -> Result<Vec<Vec<Line>>, String> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| format!("cannot connect to BIRD's control socket {}: {e}", self.socket.display()))?;
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let greeting = read_reply(&mut read).await?;
        if !greeting.iter().any(|l| l.code == 1) {
            return Err(format!("{} greets with {greeting:?}, not BIRD's 0001", self.socket.display()));
        }
        let mut replies = Vec::new();
        for command in commands {
            write.write_all(format!("{command}\n").as_bytes()).await.map_err(|e| format!("send {command:?}: {e}"))?;
            let reply = read_reply(&mut read).await.map_err(|e| format!("{command:?}: {e}"))?;
            if let Some(error) = reply.iter().find(|l| l.code >= 8000) {
                return Err(format!("{command:?}: BIRD answered {:04} {}", error.code, error.text));
            }
            replies.push(reply);
        }
        Ok(replies)
    }
}

impl RoutingDaemon for Bird {
    async fn ready(&self) -> Result<(), NotReady> {
        let asked = tokio::time::timeout(CONVERSATION, self.ask(&["show status", "show protocols all"])).await;
        let replies = match asked {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(NotReady::one(e)),
            Err(_) => {
                return Err(NotReady::one(format!(
                    "BIRD's control socket {} gave no whole answer within {CONVERSATION:?}",
                    self.socket.display()
                )));
            }
        };
        judge(&replies[0], &replies[1], self.settle)
    }
}

/// One line of a reply: its code (that of the line before, for a continuation) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub code: u16,
    pub text: String,
}

/// What one line of the wire is.
#[derive(Debug, PartialEq, Eq)]
enum Wire<'a> {
    /// A coded line; `last` when the code is followed by a space.
    Coded { code: u16, last: bool, text: &'a str },
    /// A continuation of the code before.
    More(&'a str),
    /// A spontaneous message (`+`), not part of a reply.
    Spontaneous,
}

fn wire(line: &str) -> Result<Wire<'_>, String> {
    if line.starts_with('+') {
        return Ok(Wire::Spontaneous);
    }
    if let Some(text) = line.strip_prefix(' ') {
        return Ok(Wire::More(text));
    }
    let bytes = line.as_bytes();
    let coded = bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && matches!(bytes[4], b' ' | b'-');
    if !coded {
        return Err(format!("not a line of BIRD's protocol: {line:?}"));
    }
    let code = line[..4].parse().expect("four digits");
    Ok(Wire::Coded { code, last: bytes[4] == b' ', text: &line[5..] })
}

/// The lines of one reply, read up to and including its last line.
async fn read_reply(read: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> Result<Vec<Line>, String> {
    let mut lines = Vec::new();
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = read.read_line(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("BIRD closed the control connection mid-reply".to_string());
        }
        if lines.len() > MAX_REPLY_LINES {
            return Err(format!("a reply of more than {MAX_REPLY_LINES} lines"));
        }
        if push(&mut lines, buf.trim_end_matches(['\n', '\r']))? {
            return Ok(lines);
        }
    }
}

/// Adds one wire line to `lines`; `true` when it was the reply's last.
fn push(lines: &mut Vec<Line>, line: &str) -> Result<bool, String> {
    match wire(line)? {
        Wire::Spontaneous => Ok(false),
        Wire::More(text) => {
            let code = lines.last().map(|l| l.code).ok_or_else(|| format!("a continuation first: {line:?}"))?;
            lines.push(Line { code, text: text.to_string() });
            Ok(false)
        }
        Wire::Coded { code, last, text } => {
            lines.push(Line { code, text: text.to_string() });
            Ok(last)
        }
    }
}

/// Parses a whole reply (tests).
#[cfg(test)]
fn parse(text: &str) -> Result<Vec<Line>, String> {
    let mut lines = Vec::new();
    for line in text.lines() {
        if push(&mut lines, line)? {
            return Ok(lines);
        }
    }
    Err("the reply has no last line".to_string())
}

/// One protocol of `show protocols all`: its row and the lines of detail below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Protocol {
    name: String,
    proto: String,
    state: String,
    since: String,
    info: String,
    details: Vec<String>,
}

impl Protocol {
    /// The value of a `Key: value` detail line.
    fn detail(&self, key: &str) -> Option<&str> {
        self.details.iter().find_map(|d| d.trim().strip_prefix(key)?.strip_prefix(':').map(str::trim))
    }

    /// Who it is, for messages: the name and the neighbor.
    fn who(&self) -> String {
        match self.detail("Neighbor address") {
            Some(n) => format!("BGP session {} (neighbor {n})", self.name),
            None => format!("BGP session {}", self.name),
        }
    }
}

/// The protocols of a `show protocols all` reply: code 1002 is a row, 1006 the details of the row before.
fn protocols(reply: &[Line]) -> Vec<Protocol> {
    let mut out: Vec<Protocol> = Vec::new();
    for line in reply {
        match line.code {
            1002 => {
                let mut words = line.text.split_whitespace();
                let mut next = || words.next().unwrap_or_default().to_string();
                let (name, proto, _table, state) = (next(), next(), next(), next());
                let rest: Vec<&str> = line.text.split_whitespace().skip(4).collect();
                // `timeformat protocol iso long` puts a date and a time in `Since`; the default, one of them
                let date_and_time = rest.len() >= 2 && is_date(rest[0]) && is_time(rest[1]);
                let n = if date_and_time { 2 } else { 1 }.min(rest.len());
                out.push(Protocol {
                    name,
                    proto,
                    state,
                    since: rest[..n].join(" "),
                    info: rest[n..].join(" "),
                    details: Vec::new(),
                });
            }
            1006 => {
                if let Some(p) = out.last_mut() {
                    p.details.push(line.text.clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether the node's BIRD, as `show status` and `show protocols all` describe it, has given this node every
/// peer's claims: see the module documentation.
pub(crate) fn judge(status: &[Line], shown: &[Line], settle: Duration) -> Result<(), NotReady> {
    let mut reasons = Vec::new();
    let recovery: Vec<&str> = status.iter().filter(|l| l.code == 24).map(|l| l.text.trim()).collect();
    if !recovery.is_empty() {
        reasons.push(format!(
            "BIRD is recovering from its restart until every peer's End-of-RIB has come ({})",
            recovery.join(", ")
        ));
    }
    let now = status.iter().find_map(|l| l.text.trim().strip_prefix("Current server time is ")).map(str::trim);
    let bgp: Vec<Protocol> = protocols(shown).into_iter().filter(|p| p.proto == "BGP").collect();
    if bgp.is_empty() {
        reasons.push("BIRD has no BGP session, so no other node's claims can reach this node".to_string());
    }
    for p in &bgp {
        if let Some(reason) = session(p, now, settle) {
            reasons.push(reason);
        }
    }
    if reasons.is_empty() { Ok(()) } else { Err(NotReady { reasons }) }
}

/// Why session `p` is not ready, if it is not.
fn session(p: &Protocol, now: Option<&str>, settle: Duration) -> Option<String> {
    let who = p.who();
    let bgp_state = p.detail("BGP state").unwrap_or(&p.info);
    if p.state != "up" || !bgp_state.starts_with("Established") {
        let error = p.detail("Last error").map(|e| format!(", last error: {e}")).unwrap_or_default();
        return Some(format!("{who} is {} ({bgp_state}), not established{error}", p.state));
    }
    if p.details.iter().any(|d| d.trim() == "Neighbor graceful restart active") {
        return Some(format!("{who}: the neighbor restarted and its End-of-RIB has not come yet"));
    }
    let mut channel = None;
    for d in &p.details {
        let d = d.trim();
        if let Some(name) = d.strip_prefix("Channel ") {
            channel = Some(name);
        } else if let Some(state) = d.strip_prefix("State:").map(str::trim)
            && state != "UP"
        {
            return Some(format!("{who}: channel {} is {state}", channel.unwrap_or("?")));
        } else if d.starts_with("GR recovery:") && d.contains("pending") {
            return Some(format!(
                "{who}: channel {} still waits for the neighbor's End-of-RIB",
                channel.unwrap_or("?")
            ));
        }
    }
    match elapsed(now, &p.since) {
        Some(up) if up >= settle => None,
        Some(up) => Some(format!(
            "{who} was established {:.1} s ago: its initial exchange may not be done before bird_settle_ms ({} ms)",
            up.as_secs_f64(),
            settle.as_millis()
        )),
        None => Some(format!(
            "{who}: cannot tell how long it has been established from BIRD's times (server time {now:?}, since {:?}): \
             leave BIRD's timeformat at its default or set it to iso long",
            p.since
        )),
    }
}

/// A time as BIRD prints it: a date, a time of day, or both.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shown {
    /// Days since 1970-01-01.
    day: Option<i64>,
    /// Seconds since midnight.
    second: Option<f64>,
}

fn is_date(s: &str) -> bool {
    date(s).is_some()
}

fn is_time(s: &str) -> bool {
    time(s).is_some()
}

/// `YYYY-MM-DD` as days since the epoch (the proleptic Gregorian calendar; H. Hinnant's `days_from_civil`).
fn date(s: &str) -> Option<i64> {
    let mut parts = s.split('-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || s.len() != 10 {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// `HH:MM:SS`, with a fraction or not, as seconds since midnight.
fn time(s: &str) -> Option<f64> {
    let mut parts = s.split(':');
    let h: u32 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let sec: f64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || h > 23 || m > 59 || !(0.0..61.0).contains(&sec) {
        return None;
    }
    Some(f64::from(h * 3600 + m * 60) + sec)
}

fn shown(s: &str) -> Option<Shown> {
    let words: Vec<&str> = s.split_whitespace().collect();
    match words.as_slice() {
        [d, t] => Some(Shown { day: Some(date(d)?), second: Some(time(t)?) }),
        [one] => match (date(one), time(one)) {
            (Some(day), _) => Some(Shown { day: Some(day), second: None }),
            (None, Some(second)) => Some(Shown { day: None, second: Some(second) }),
            (None, None) => None,
        },
        _ => None,
    }
}

/// How long ago `since` was, at BIRD's server time `now`. BIRD's default prints the time of day alone when it was
/// less than 20 hours ago and the date alone before: a time of day later than now's was yesterday; a date alone is
/// long ago.
fn elapsed(now: Option<&str>, since: &str) -> Option<Duration> {
    let now = shown(now?)?;
    let since = shown(since)?;
    let now_second = now.second?;
    let seconds = match (since.day, since.second, now.day) {
        (Some(_), None, _) => return Some(Duration::MAX),
        (Some(d), Some(s), Some(today)) => (today - d) as f64 * 86_400.0 + now_second - s,
        (None, Some(s), _) if s <= now_second => now_second - s,
        (None, Some(s), _) => now_second + 86_400.0 - s,
        _ => return None,
    };
    // a clock set back makes no session older than it is
    Some(Duration::from_secs_f64(seconds.max(0.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "1000-BIRD 2.0.12
1011-Router ID is 198.18.99.1
 Hostname is vm
 Current server time is 2026-12-05 13:12:02.518
 Last reboot on 2026-12-05 13:11:52.626
 Last reconfiguration on 2026-12-05 13:11:52.626
0013 Daemon is up and running
";

    const RECOVERING: &str = "1000-BIRD 2.0.12
1011-Router ID is 198.18.99.2
 Current server time is 2026-12-05 13:13:06.465
0024-Graceful restart recovery in progress
   Waiting for 1 channels to recover
   Wait timer is 239.495/240
0013 Daemon is up and running
";

    /// BIRD 2.0.12's `show protocols all` as it prints it, trimmed: a device, a kernel and one BGP protocol.
    fn protocols_all(row: &str, bgp: &str) -> String {
        format!(
            "2002-Name       Proto      Table      State  Since         Info
1002-device1    Device     ---        up     13:11:52.626  
1006-
1002-hereabouts_kernel4 Kernel     master4    up     13:11:52.626  
1006-  Channel ipv4
     State:          UP
     Table:          master4
     GR recovery:    waiting
 
1002-{row}
1006-{bgp}
 
0000 
"
        )
    }

    const ESTABLISHED: &str = "peer0_4    BGP        ---        up     13:11:57.157  Established   ";
    const DETAILS_UP: &str = "  BGP state:          Established
     Neighbor address: 198.18.99.2
     Neighbor AS:      65002
     Local AS:         65001
     Neighbor ID:      198.18.99.2
     Session:          external AS4
   Channel ipv4
     State:          UP
     Table:          master4
     Routes:         1 imported, 1 exported, 1 preferred
     BGP Next hop:   198.18.99.1";

    fn lines(s: &str) -> Vec<Line> {
        parse(s).unwrap()
    }

    fn judged(status: &str, shown: &str, settle_ms: u64) -> Result<(), NotReady> {
        judge(&lines(status), &lines(shown), Duration::from_millis(settle_ms))
    }

    #[test]
    fn the_wire_has_codes_continuations_and_a_last_line() {
        let reply =
            lines("1000-BIRD 2.0.12\n+spontaneous\n1011-Router ID is 1.2.3.4\n Hostname is vm\n0013 Daemon is up\n");
        assert_eq!(
            reply,
            [
                Line { code: 1000, text: "BIRD 2.0.12".into() },
                Line { code: 1011, text: "Router ID is 1.2.3.4".into() },
                Line { code: 1011, text: "Hostname is vm".into() },
                Line { code: 13, text: "Daemon is up".into() },
            ]
        );
        assert_eq!(lines("0000 \nnot read\n").len(), 1, "the reply ends at its last line");
        assert!(parse("1000-BIRD\n").is_err(), "no last line");
        assert!(parse(" continuation first\n0000 \n").is_err());
        assert!(parse("HTTP/1.1 200 OK\n").unwrap_err().contains("not a line of BIRD's protocol"));
        assert!(parse("12a4 x\n").is_err());
    }

    #[test]
    fn protocol_rows_and_details_are_read() {
        let ps = protocols(&lines(&protocols_all(ESTABLISHED, DETAILS_UP)));
        assert_eq!(
            ps.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["device1", "hereabouts_kernel4", "peer0_4"]
        );
        let bgp = &ps[2];
        assert_eq!((bgp.proto.as_str(), bgp.state.as_str(), bgp.since.as_str()), ("BGP", "up", "13:11:57.157"));
        assert_eq!(bgp.info, "Established");
        assert_eq!(bgp.detail("Neighbor address"), Some("198.18.99.2"));
        let long = protocols(&lines(
            "1002-p BGP --- start 2026-12-05 13:12:18 Active Received: Administrative shutdown\n0000 \n",
        ));
        assert_eq!(
            (long[0].since.as_str(), long[0].info.as_str()),
            ("2026-12-05 13:12:18", "Active Received: Administrative shutdown")
        );
    }

    #[test]
    fn every_session_established_long_enough_is_ready() {
        // established 5.4 s before the server time
        assert_eq!(judged(STATUS, &protocols_all(ESTABLISHED, DETAILS_UP), 3000), Ok(()));
        let e = judged(STATUS, &protocols_all(ESTABLISHED, DETAILS_UP), 6000).unwrap_err();
        assert_eq!(e.reasons.len(), 1);
        assert!(
            e.reasons[0].starts_with("BGP session peer0_4 (neighbor 198.18.99.2) was established 5.4 s ago"),
            "{e}"
        );
    }

    #[test]
    fn a_session_that_is_down_restarting_or_recovering_is_not_ready() {
        let down =
            "peer0_4    BGP        ---        start  13:12:18.784  Active        Received: Administrative shutdown";
        let details = "  BGP state:          Active
     Neighbor address: 198.18.99.2
     Connect delay:    3.586/5
     Last error:       Received: Administrative shutdown
   Channel ipv4
     State:          DOWN";
        let e = judged(STATUS, &protocols_all(down, details), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the routing daemon is not ready, so other nodes' claims may be missing here: BGP session peer0_4 \
             (neighbor 198.18.99.2) is start (Active), not established, last error: Received: Administrative shutdown"
        );

        let restarting = DETAILS_UP
            .replace("Local AS:         65001", "Local AS:         65001\n    Neighbor graceful restart active");
        let e = judged(STATUS, &protocols_all(ESTABLISHED, &restarting), 0).unwrap_err();
        assert!(e.reasons[0].contains("End-of-RIB has not come"), "{e}");

        let pending =
            DETAILS_UP.replace("Table:          master4", "Table:          master4\n    GR recovery:    pending");
        let e = judged(RECOVERING, &protocols_all(ESTABLISHED, &pending), 0).unwrap_err();
        assert!(e.reasons[0].starts_with("BIRD is recovering from its restart"), "{e}");
        assert!(e.reasons[0].contains("Waiting for 1 channels to recover"), "{e}");
        assert!(e.reasons[1].contains("channel ipv4 still waits for the neighbor's End-of-RIB"), "{e}");

        let e = judged(STATUS, &protocols_all("kernel2 Kernel master6 up 13:11:52.626", ""), 0).unwrap_err();
        assert!(e.reasons[0].contains("no BGP session"), "{e}");
    }

    #[test]
    fn times_are_read_in_birds_formats() {
        let now = Some("2026-12-05 13:12:02.518");
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        assert_eq!(ms(elapsed(now, "13:11:57.157")), Some(5361));
        assert_eq!(ms(elapsed(now, "13:11:57")), Some(5518));
        assert_eq!(ms(elapsed(now, "2026-12-05 13:11:57.018")), Some(5500));
        assert_eq!(ms(elapsed(now, "2026-12-04 13:12:02.518")), Some(86_400_000));
        // before midnight, shown as the time of day alone
        assert_eq!(ms(elapsed(Some("2026-12-05 00:00:01.000"), "23:59:59.500")), Some(1500));
        assert_eq!(elapsed(now, "2026-11-30"), Some(Duration::MAX));
        assert_eq!(elapsed(now, "yesterday"), None);
        assert_eq!(elapsed(Some("13:12"), "13:11:57"), None);
        assert_eq!(date("1970-01-01"), Some(0));
        assert_eq!(date("2000-03-01"), Some(11_017));
        assert_eq!(date("2026-02-30x"), None);
    }

    #[tokio::test]
    async fn an_absent_socket_is_not_ready_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let e = Bird::new(&dir.path().join("bird.ctl"), Duration::ZERO).ready().await.unwrap_err();
        assert!(e.reasons[0].starts_with("cannot connect to BIRD's control socket"), "{e}");
        assert!(e.reasons[0].contains("bird.ctl"), "{e}");
    }

    #[tokio::test]
    async fn a_conversation_over_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bird.ctl");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut read = BufReader::new(read);
            write.write_all(b"0001 BIRD 2.0.12 ready.\n").await.unwrap();
            let mut command = String::new();
            read.read_line(&mut command).await.unwrap();
            assert_eq!(command, "show status\n");
            write.write_all(STATUS.as_bytes()).await.unwrap();
            command.clear();
            read.read_line(&mut command).await.unwrap();
            assert_eq!(command, "show protocols all\n");
            write.write_all(b"9001 syntax error\n").await.unwrap();
        });
        let e = Bird::new(&path, Duration::ZERO).ready().await.unwrap_err();
        assert_eq!(e.reasons, ["\"show protocols all\": BIRD answered 9001 syntax error"]);
        server.await.unwrap();
    }
}
