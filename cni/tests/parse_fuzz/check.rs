//! What must hold for every generated invocation, and the counts the run reports.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use hereabouts_cni::env::Command;
use hereabouts_cni::{CniEnv, CniError, dispatch};
use hereabouts_ipam::codes::{Code, NEWEST_VERSION, SUPPORTED_VERSIONS};
use hereabouts_ipam::config::{self, Input, IpamConfig};
use hereabouts_ipam::names;
use hereabouts_ipam::range::IpRange;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use serde_json::Value;
use tokio::runtime::Runtime;

use super::env::env_is_valid;
use super::{Case, TestConnector};

/// Every code of `ipam/src/codes.rs`.
const CODES: [u32; 13] = [1, 2, 4, 5, 6, 7, 11, 50, 100, 101, 102, 103, 104];

type Outcome = Result<Option<String>, CniError>;

/// Per verb: how many triples were valid (the strict loader accepts config and CNI_ARGS, a kubeconfig is named,
/// and ADD names the pod) and how many not; the codes seen.
#[derive(Debug, Default)]
pub struct Stats {
    verbs: BTreeMap<&'static str, (u64, u64)>,
    env_refused: u64,
    intended_valid: u64,
    codes: BTreeMap<u32, u64>,
    exhausted: u64,
}

impl Stats {
    fn cases(&self) -> u64 {
        self.env_refused + self.verbs.values().map(|(v, i)| v + i).sum::<u64>()
    }

    /// The generator still reaches what it is meant to: every verb, valid and invalid triples of each in a
    /// useful proportion, and refusals of every kind. A change that makes it produce only junk fails here.
    pub fn assert_coverage(&self, cases: u32) {
        if cases < 5_000 {
            return;
        }
        for verb in ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"] {
            let (valid, invalid) = self.verbs.get(verb).copied().unwrap_or_default();
            let share = valid as f64 / (valid + invalid).max(1) as f64;
            assert!(
                (0.2..=0.7).contains(&share),
                "{verb}: {valid} valid of {}: the generator drifted",
                valid + invalid
            );
        }
        for code in [1, 2, 4, 6, 7, 100, 102] {
            assert!(self.codes.contains_key(&code), "no invocation ended with code {code}: the generator drifted");
        }
        assert!(self.env_refused > 0 && self.intended_valid > 0, "the generator drifted: {self}");
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} cases; {} refused by CniEnv::from_lookup (code 4)", self.cases(), self.env_refused)?;
        for (verb, (valid, invalid)) in &self.verbs {
            writeln!(f, "  {verb:<8} {:>8} valid {:>8} invalid", valid, invalid)?;
        }
        writeln!(f, "  valid by construction (config and CNI_ARGS): {}", self.intended_valid)?;
        writeln!(f, "  valid ADD refused, a range without a usable address (code 100): {}", self.exhausted)?;
        let codes: Vec<String> = self.codes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        write!(f, "  error codes from dispatch: {}", codes.join(", "))
    }
}

fn verb(c: Command) -> &'static str {
    match c {
        Command::Add => "ADD",
        Command::Del => "DEL",
        Command::Check => "CHECK",
        Command::Gc => "GC",
        Command::Status => "STATUS",
        Command::Version => "VERSION",
    }
}

/// What the strict path must do with a triple.
enum Verdict {
    Refused(Code),
    Valid(Box<IpamConfig>),
}

fn strict_verdict(env: &CniEnv, loaded: &Result<IpamConfig, config::ConfigError>) -> Verdict {
    let cfg = match loaded {
        Err(e) => return Verdict::Refused(e.code()),
        Ok(cfg) => cfg,
    };
    if env.command == Command::Add && cfg.require_pod().is_err() {
        return Verdict::Refused(Code::InvalidEnvironment);
    }
    if cfg.mode.kube().is_none_or(|k| k.kubeconfig.is_none()) {
        return Verdict::Refused(Code::InvalidConfig);
    }
    Verdict::Valid(Box::new(cfg.clone()))
}

/// Runs one case and checks it.
pub fn run(rt: &Runtime, case: &Case, stats: &mut Stats) -> TestCaseResult {
    hereabouts_ipam::entropy::seed_thread(case.entropy_seed());
    let env = match CniEnv::from_lookup(|k| case.env.get(k).cloned()) {
        Ok(env) => env,
        Err(e) => {
            prop_assert!(!env_is_valid(&case.env), "a valid environment refused: {}", e.details);
            prop_assert_eq!(e.code, Code::InvalidEnvironment, "{}", e.details);
            outcome_shape(&Err(e), &case.stdin)?;
            stats.env_refused += 1;
            return Ok(());
        }
    };
    prop_assert!(env_is_valid(&case.env), "an invalid environment accepted");
    let loaded = config::load(&Input { stdin: &case.stdin, cni_args: &env.args });
    if case.intended_valid {
        stats.intended_valid += 1;
        prop_assert!(loaded.is_ok(), "a config valid by construction refused: {}", loaded.unwrap_err());
    }
    let verdict = strict_verdict(&env, &loaded);
    let counts = stats.verbs.entry(verb(env.command)).or_default();
    match verdict {
        Verdict::Valid(_) => counts.0 += 1,
        Verdict::Refused(_) => counts.1 += 1,
    }
    let host = TestConnector::new();
    let out = rt.block_on(dispatch(&env, &case.stdin, &host, |_, _| {}));
    outcome_shape(&out, &case.stdin)?;
    if let Err(e) = &out {
        *stats.codes.entry(e.code.number()).or_default() += 1;
    }
    match env.command {
        Command::Version => version(&out, &case.stdin, &host),
        Command::Del | Command::Gc => release(&env, &out, &case.stdin, &host),
        Command::Add | Command::Check | Command::Status => match verdict {
            Verdict::Refused(code) => {
                let e = out.as_ref().err();
                prop_assert_eq!(e.map(|e| e.code), Some(code), "strict path, expected code {}: {:?}", code, out);
                prop_assert_eq!(host.connects.get(), 0, "connected for a refused config");
                prop_assert_eq!(host.store.writes(), 0);
                Ok(())
            }
            Verdict::Valid(cfg) => {
                prop_assert_eq!(host.connects.get(), 1);
                match env.command {
                    Command::Add => add(rt, &env, case, &cfg, &host, out, stats),
                    Command::Check => {
                        let want = if cfg.ranges.is_empty() { None } else { Some(Code::AllocationMissing) };
                        prop_assert_eq!(out.as_ref().err().map(|e| e.code), want, "{:?}", out);
                        prop_assert_eq!(host.store.writes(), 0);
                        Ok(())
                    }
                    _ => {
                        prop_assert!(matches!(out, Ok(None)), "STATUS: {:?}", out);
                        prop_assert_eq!(host.store.writes(), 0);
                        Ok(())
                    }
                }
            }
        },
    }
}

/// Every outcome: `Ok` or a CNI error with a known code, details, and a JSON rendering with all three fields.
fn outcome_shape(out: &Outcome, stdin: &[u8]) -> TestCaseResult {
    let Err(e) = out else { return Ok(()) };
    let n = e.code.number();
    prop_assert!(CODES.contains(&n), "unknown code {}", n);
    prop_assert!(!e.details.is_empty(), "code {} without details", n);
    let version = requested_version(stdin);
    let json: Value = serde_json::from_str(&e.to_json(&version)).map_err(|err| TestCaseError::fail(err.to_string()))?;
    prop_assert_eq!(&json["code"], &Value::from(n));
    prop_assert_eq!(json["msg"].as_str(), Some(e.msg()));
    prop_assert!(!e.msg().is_empty());
    prop_assert_eq!(json["details"].as_str(), Some(e.details.as_str()));
    prop_assert_eq!(json["cniVersion"].as_str(), Some(version.as_str()));
    Ok(())
}

/// The version replies are written in: the config's when it is one the plugin speaks, else the newest.
fn requested_version(stdin: &[u8]) -> String {
    let v: Option<Value> = serde_json::from_slice(stdin).ok();
    let asked = v.as_ref().and_then(|v| v.get("cniVersion")?.as_str());
    asked.filter(|a| SUPPORTED_VERSIONS.contains(a)).unwrap_or(NEWEST_VERSION).to_string()
}

fn version(out: &Outcome, stdin: &[u8], host: &TestConnector) -> TestCaseResult {
    let Ok(Some(text)) = out else { return Err(TestCaseError::fail(format!("VERSION: {out:?}"))) };
    let json: Value = serde_json::from_str(text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&json["supportedVersions"], &serde_json::json!(SUPPORTED_VERSIONS));
    let want = requested_version(stdin);
    prop_assert_eq!(json["cniVersion"].as_str(), Some(want.as_str()));
    prop_assert_eq!(host.connects.get(), 0);
    prop_assert_eq!(host.store.writes(), 0);
    Ok(())
}

/// `cni.dev/valid-attachments`, read as the plugin documents it.
#[derive(Debug, serde::Deserialize)]
#[allow(dead_code)] // read only to tell whether the list parses
struct Attachment {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
}

/// The code GC must refuse with for want of a readable attachment list: 6 for stdin that is not JSON, 7 for a
/// missing or malformed list.
fn gc_refusal(stdin: &[u8]) -> Option<Code> {
    let Ok(doc) = serde_json::from_slice::<Value>(stdin) else { return Some(Code::Decode) };
    match doc.get("cni.dev/valid-attachments") {
        None => Some(Code::InvalidConfig),
        Some(list) => serde_json::from_value::<Vec<Attachment>>(list.clone()).err().map(|_| Code::InvalidConfig),
    }
}

/// DEL and GC, on a store that holds nothing: no error but "try again later" (and GC's refusal of a list it
/// cannot read), and no write.
fn release(env: &CniEnv, out: &Outcome, stdin: &[u8], host: &TestConnector) -> TestCaseResult {
    let code = out.as_ref().err().map(|e| e.code);
    let refusal = if env.command == Command::Gc { gc_refusal(stdin) } else { None };
    match refusal {
        Some(want) => prop_assert_eq!(code, Some(want), "{:?}", out),
        None => prop_assert!(
            matches!(out, Ok(None)) || code == Some(Code::TryAgainLater),
            "{} must not fail but to be retried: {:?}",
            verb(env.command),
            out
        ),
    }
    prop_assert!(host.connects.get() <= 1);
    prop_assert_eq!(host.store.writes(), 0, "{} of an attachment that holds nothing wrote", verb(env.command));
    Ok(())
}

/// One entry of an ADD result's `ips`.
#[derive(Debug, Clone, PartialEq)]
struct ResultIp {
    ip: IpAddr,
    prefix: u8,
    gateway: Option<String>,
}

fn result_ips(text: &str, cfg: &IpamConfig) -> Result<Vec<ResultIp>, TestCaseError> {
    let json: Value = serde_json::from_str(text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(json["cniVersion"].as_str(), Some(cfg.cni_version.as_str()));
    let Some(ips) = json["ips"].as_array() else { return Err(TestCaseError::fail(format!("no ips: {text}"))) };
    let legacy = !cfg.cni_version.starts_with("1.");
    let mut out = Vec::new();
    for entry in ips {
        let address = entry["address"].as_str().unwrap_or_default();
        let Some((ip, prefix)) = address.split_once('/') else {
            return Err(TestCaseError::fail(format!("address {address:?} has no prefix")));
        };
        let ip: IpAddr = ip.parse().map_err(|_| TestCaseError::fail(format!("address {address:?}")))?;
        let prefix: u8 = prefix.parse().map_err(|_| TestCaseError::fail(format!("address {address:?}")))?;
        if legacy {
            prop_assert_eq!(entry["version"].as_str(), Some(if ip.is_ipv4() { "4" } else { "6" }));
        }
        out.push(ResultIp { ip, prefix, gateway: entry["gateway"].as_str().map(str::to_string) });
    }
    Ok(out)
}

/// The pod CNI_ARGS names, read from the text itself rather than through the loader.
fn pod_of(args: &str) -> String {
    let get = |key: &str| args.split(';').find_map(|p| p.strip_prefix(key)?.strip_prefix('=')).unwrap_or_default();
    format!("{}/{}", get("K8S_POD_NAMESPACE"), get("K8S_POD_NAME"))
}

/// Whether some pool still holds an entry of the attachment `env` names.
fn holds_any(host: &TestConnector, env: &CniEnv) -> bool {
    host.store
        .pools()
        .iter()
        .any(|p| p.spec.allocations.values().any(|a| a.id == env.container_id && a.ifname == env.ifname))
}

/// A valid ADD: one usable address per range (the requested one where one is asked for) and the static
/// addresses, each range's recorded for the pod in its pool (and reserved when overlapping ranges are on); a
/// repeat returns the same; CHECK finds them; DEL gives them all back; a second DEL writes nothing.
fn add(
    rt: &Runtime,
    env: &CniEnv,
    case: &Case,
    cfg: &IpamConfig,
    host: &TestConnector,
    out: Outcome,
    stats: &mut Stats,
) -> TestCaseResult {
    let text = match out {
        Ok(Some(text)) => text,
        Err(e) if e.code == Code::RangeExhausted && cfg.ranges.iter().any(|r| r.usable_count() == 0) => {
            stats.exhausted += 1;
            prop_assert!(!holds_any(host, env), "a failed ADD left an entry behind");
            return Ok(());
        }
        other => return Err(TestCaseError::fail(format!("a valid ADD failed: {other:?}"))),
    };
    let ips = result_ips(&text, cfg)?;
    prop_assert_eq!(ips.len(), cfg.ranges.len() + cfg.addresses.len(), "{}", text);
    for (i, (r, got)) in cfg.ranges.iter().zip(&ips).enumerate() {
        // ranges of one config may overlap: each gives an address of its own
        prop_assert!(!ips[..i].iter().any(|e| e.ip == got.ip), "{} handed out twice in one result", got.ip);
        assigned_from(i, r, got, env, cfg, host)?;
    }
    for (s, got) in cfg.addresses.iter().zip(&ips[cfg.ranges.len()..]) {
        prop_assert_eq!(got.ip, s.address.addr());
        prop_assert_eq!(got.prefix, s.address.prefix_len());
        prop_assert_eq!(&got.gateway, &s.gateway.map(|g| g.to_string()));
    }
    if !cfg.ranges.is_empty() {
        prop_assert!(host.store.writes() > 0);
    }
    after_add(rt, env, case, cfg, host, &ips)
}

/// `got` came from `r`: a usable address (the requested one, if `r` holds it) with `r`'s prefix and gateway,
/// recorded in `r`'s pool for the pod and attachment, and reserved when overlapping ranges are on.
fn assigned_from(
    index: usize,
    r: &IpRange,
    got: &ResultIp,
    env: &CniEnv,
    cfg: &IpamConfig,
    host: &TestConnector,
) -> TestCaseResult {
    let Some(offset) = r.offset_of(got.ip).filter(|o| r.is_usable(*o)) else {
        return Err(TestCaseError::fail(format!("{} is not a usable address of {}", got.ip, r.cidr())));
    };
    prop_assert_eq!(got.prefix, r.cidr().prefix_len());
    if let Some(asked) = cfg.requested_for(index) {
        prop_assert_eq!(got.ip, asked, "the requested address was not handed out");
    }
    let gw = cfg.gateway.filter(|g| r.cidr().contains(g)).map(|g| g.to_string());
    prop_assert_eq!(&got.gateway, &gw);
    let pools = host.store.pools();
    // one pool per range, or in slice mode the pool of the slice that holds the address (offsets from its own
    // network address)
    let (name, offset) = match &cfg.mode {
        hereabouts_ipam::Mode::Slices(_) => {
            let slice_of = |p: &hereabouts_ipam::crd::IpPool| p.spec.range.parse::<ipnet::IpNet>().ok();
            let pool = pools.iter().find(|p| slice_of(p).is_some_and(|c| c.contains(&got.ip)));
            let Some(pool) = pool else { return Err(TestCaseError::fail(format!("no slice pool holds {}", got.ip))) };
            let base = slice_of(pool).expect("found by its range").network();
            let offset = match (got.ip, base) {
                (IpAddr::V4(ip), IpAddr::V4(b)) => u128::from(u32::from(ip) - u32::from(b)),
                (IpAddr::V6(ip), IpAddr::V6(b)) => u128::from(ip) - u128::from(b),
                _ => return Err(TestCaseError::fail("a slice of the other family")),
            };
            (pool.metadata.name.clone().unwrap_or_default(), offset)
        }
        _ => (names::pool_name(&cfg.network_name, r.cidr()), offset),
    };
    let entry = pools
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
        .and_then(|p| p.spec.allocations.get(&offset.to_string()));
    let Some(entry) = entry else { return Err(TestCaseError::fail(format!("no entry for {} in {name}", got.ip))) };
    prop_assert_eq!(&entry.podref, &pod_of(&env.args));
    prop_assert_eq!(&entry.id, &env.container_id);
    prop_assert_eq!(&entry.ifname, &env.ifname);
    if cfg.mode.kube().is_some_and(|k| k.overlapping_ranges) {
        let reservation = names::reservation_name(&cfg.network_name, got.ip);
        prop_assert!(reserved(host, &reservation), "no reservation {} for {}", reservation, got.ip);
    }
    Ok(())
}

fn reserved(host: &TestConnector, name: &str) -> bool {
    host.store.reservations().iter().any(|x| x.metadata.name.as_deref() == Some(name))
}

/// After a successful ADD of `ips`: a repeat hands out the same, CHECK passes, DEL releases every entry and
/// reservation of the attachment, and a second DEL writes nothing.
fn after_add(
    rt: &Runtime,
    env: &CniEnv,
    case: &Case,
    cfg: &IpamConfig,
    host: &TestConnector,
    ips: &[ResultIp],
) -> TestCaseResult {
    let again = rt.block_on(dispatch(env, &case.stdin, host, |_, _| {}));
    let Ok(Some(again)) = again else { return Err(TestCaseError::fail(format!("a repeated ADD failed: {again:?}"))) };
    prop_assert_eq!(&result_ips(&again, cfg)?, ips, "a repeated ADD handed out other addresses");

    let mut other = env.clone();
    other.command = Command::Check;
    let checked = rt.block_on(dispatch(&other, &case.stdin, host, |_, _| {}));
    prop_assert!(matches!(checked, Ok(None)), "CHECK after ADD: {:?}", checked);

    other.command = Command::Del;
    let deleted = rt.block_on(dispatch(&other, &case.stdin, host, |_, _| {}));
    prop_assert!(matches!(deleted, Ok(None)), "DEL after ADD: {:?}", deleted);
    prop_assert!(!holds_any(host, env), "DEL left an entry of the attachment");
    for got in &ips[..cfg.ranges.len()] {
        let name = names::reservation_name(&cfg.network_name, got.ip);
        prop_assert!(!reserved(host, &name), "DEL left reservation {}", name);
    }
    let writes = host.store.writes();
    let deleted = rt.block_on(dispatch(&other, &case.stdin, host, |_, _| {}));
    prop_assert!(matches!(deleted, Ok(None)), "second DEL: {:?}", deleted);
    prop_assert_eq!(host.store.writes(), writes, "DEL of an attachment that holds nothing wrote");
    Ok(())
}
