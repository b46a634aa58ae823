//! The whole CNI parse path under generated input: (network config, CNI_ARGS, environment) triples go through
//! `CniEnv::from_lookup` and `dispatch`, as the binary runs them, against an in-memory store.
//!
//! A good share of the configs are valid by construction ([`config`]); the rest are broken in many ways
//! ([`mutate`], [`env`]). What must hold for every triple is in [`check`]: no panic, a well-formed outcome, the
//! strict loader's code and no write for a refused ADD/CHECK/STATUS, a lenient DEL/GC, and for a valid ADD
//! addresses from the configured ranges, recorded for the pod, handed out again by a repeated ADD, found by
//! CHECK and given back by DEL.
//!
//! `HEREABOUTS_FUZZ_CASES` sets the number of triples (default [`DEFAULT_CASES`]), `HEREABOUTS_FUZZ_SEED` the
//! seed (default [`DEFAULT_SEED`]); the same seed and count replay the same triples.

// A test target's root is its own crate root: its modules are found beside it unless told otherwise.
#[path = "parse_fuzz/check.rs"]
mod check;
#[path = "parse_fuzz/config.rs"]
mod config;
#[path = "parse_fuzz/env.rs"]
mod env;
#[path = "parse_fuzz/mutate.rs"]
mod mutate;
#[path = "parse_fuzz/regressions.rs"]
mod regressions;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Instant;

use hereabouts_ipam::config::DEFAULT_FLAT_FILE_PATHS;
use hereabouts_ipam::routetable::{KernelTable, TableError};
use hereabouts_ipam::store::{ConnectError, MemoryStore};
use hereabouts_ipam::verbs::Host;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};

use check::Stats;
use config::{Netconf, netconf_seed};
use env::{args_plan, env_plan};
use mutate::{keep_flat_file_missing, mutation, shape};

/// Triples per run when `HEREABOUTS_FUZZ_CASES` is not set: about 15 s of a debug build on an idle 2-core machine.
const DEFAULT_CASES: u32 = 20_000;

/// The seed when `HEREABOUTS_FUZZ_SEED` is not set: CI replays the same triples every time.
const DEFAULT_SEED: u64 = 0x6865_7265_6162_6f75;

/// A `configuration_path` the mutations use: it must not exist, so that it is refused as missing.
const MISSING_FLAT_FILE: &str = "/nonexistent/hereabouts-parse-fuzz/flat.conf";

/// One generated invocation.
#[derive(Clone)]
pub struct Case {
    pub stdin: Vec<u8>,
    pub env: BTreeMap<&'static str, String>,
    /// The config and CNI_ARGS are valid by construction: the strict loader must accept them.
    pub intended_valid: bool,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Case");
        match std::str::from_utf8(&self.stdin) {
            Ok(text) => d.field("stdin", &text),
            Err(_) => d.field("stdin_bytes", &self.stdin),
        };
        d.field("env", &self.env).field("intended_valid", &self.intended_valid).finish()
    }
}

impl Case {
    /// The product's random choices (which free address after a lost race, backoff jitter) for this case: the
    /// same case makes the same choices, so a failure replays.
    fn entropy_seed(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        self.stdin.hash(&mut h);
        self.env.hash(&mut h);
        h.finish()
    }
}

fn case() -> impl Strategy<Value = Case> {
    let mutations = prop_oneof![3 => Just(Vec::new()), 2 => prop::collection::vec(mutation(), 1..4)];
    (netconf_seed(), mutations, shape(), args_plan(), env_plan()).prop_map(|(seed, mutations, shape, args, env)| {
        let conf = Netconf::build(&seed);
        let mut value = conf.value.clone();
        for m in &mutations {
            m.apply(&mut value);
        }
        keep_flat_file_missing(&mut value, MISSING_FLAT_FILE);
        let args_text = args.render(&conf);
        Case {
            stdin: shape.render(&value),
            env: env.render(&args_text),
            intended_valid: conf.valid && mutations.is_empty() && shape.is_faithful() && args_text.valid,
        }
    })
}

/// A store in memory instead of an API server, no routing table, no host lock (and the tests start no logging).
/// Counts connects: a config refused by the strict loader must never cost one.
#[derive(Debug)]
pub struct TestConnector {
    pub store: MemoryStore,
    pub connects: Cell<u32>,
}

impl TestConnector {
    fn new() -> Self {
        Self { store: MemoryStore::new("kube-system"), connects: Cell::new(0) }
    }
}

impl Host for TestConnector {
    type Store = MemoryStore;
    type Table = KernelTable;

    async fn connect(&self, _kubeconfig: &Path) -> Result<MemoryStore, ConnectError> {
        self.connects.set(self.connects.get() + 1);
        Ok(self.store.clone())
    }

    fn table(&self) -> Result<KernelTable, TableError> {
        Err(TableError::Netlink { op: "open a netlink socket", detail: "the generated configs use no route".into() })
    }

    fn lock_dir(&self) -> Option<std::path::PathBuf> {
        None
    }
}

/// A flat file at a default path would be merged into every config and change what is tested.
fn refuse_flat_files() {
    for path in DEFAULT_FLAT_FILE_PATHS.iter().chain([&MISSING_FLAT_FILE]) {
        assert!(
            std::fs::symlink_metadata(path).is_err(),
            "{path} exists on this machine: the strict loader would merge it into every generated config (or, for \
             {MISSING_FLAT_FILE}, find a file the test means to be missing); remove it before running this test"
        );
    }
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("{name}={s:?} is not a number")),
        Err(_) => default,
    }
}

#[test]
fn generated_triples_through_dispatch() {
    refuse_flat_files();
    let cases: u32 = env_number("HEREABOUTS_FUZZ_CASES", DEFAULT_CASES);
    let seed: u64 = env_number("HEREABOUTS_FUZZ_SEED", DEFAULT_SEED);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    // XorShift rather than proptest's default ChaCha, which takes a quarter of a debug run
    let mut seed_bytes = [0u8; 16];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    seed_bytes[8..].copy_from_slice(&(!seed).to_le_bytes());
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::XorShift, &seed_bytes));
    let stats = RefCell::new(Stats::default());
    let started = Instant::now();
    let result = runner.run(&case(), |case| check::run(&rt, &case, &mut stats.borrow_mut()));
    let stats = stats.into_inner();
    if let Err(e) = result {
        panic!("{e}\nreplay with HEREABOUTS_FUZZ_SEED={seed} HEREABOUTS_FUZZ_CASES={cases}");
    }
    eprintln!("parse_fuzz: seed {seed}, {:.1?}\n{stats}", started.elapsed());
    stats.assert_coverage(cases);
}
