use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use clap::Parser as _;
use hereabouts_ipam::config::{IGNORED_KEYS, IPAM_KEYS, Input, LogLevel, ROUTING_KEYS, load_with_paths};
use serde_json::{Value, json};

use super::render::{self, Credentials};
use super::token::{Minted, refresh_after};
use super::{Args, Installer, files};

/// A directory removed on drop (the reconciler crate has no `tempfile`).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("hereabouts-install-cni-unit-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

fn creds(token: &str) -> Credentials {
    Credentials { token: token.into(), ca: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec() }
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn parse_args(argv: &[&str]) -> Result<Args, clap::Error> {
    Cli::try_parse_from(std::iter::once("install-cni").chain(argv.iter().copied())).map(|c| c.args)
}

#[test]
fn kubeconfig_parses_with_kube_and_embeds_everything() {
    let c = creds("the-token");
    let text = String::from_utf8(render::kubeconfig("https://[fd00::1]:6443", "pools", &c)).unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some(render::CONTEXT));
    assert_eq!(hereabouts_ipam::store::namespace_of(&kc), "pools");
    let cluster = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://[fd00::1]:6443"));
    let ca = base64::engine::general_purpose::STANDARD.decode(cluster.certificate_authority_data.as_ref().unwrap());
    assert_eq!(ca.unwrap(), c.ca);
    assert!(cluster.certificate_authority.is_none(), "the CA is embedded, not a path");
    let user = serde_json::to_value(kc.auth_infos[0].auth_info.as_ref().unwrap()).unwrap();
    assert_eq!(user["token"], "the-token");
}

#[test]
fn credentials_debug_hides_the_token() {
    let shown = format!("{:?}", creds("s3cr3t"));
    assert!(!shown.contains("s3cr3t"), "{shown}");
}

#[test]
fn flat_file_loads_as_the_cni_plugin_loads_it() {
    let dir = TempDir::new();
    let path = dir.join("hereabouts.conf");
    let contents = render::flat_file(&render::FlatFile {
        kubeconfig: "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig",
        log_level: LogLevel::Verbose,
        log_file: Some("/var/log/hereabouts.log"),
        reconciler_cron_expression: Some("30 4 * * *"),
    });
    let doc: Value = serde_json::from_slice(&contents).unwrap();
    for key in doc.as_object().unwrap().keys() {
        let known = [IPAM_KEYS, ROUTING_KEYS, IGNORED_KEYS].concat();
        assert!(known.contains(&key.as_str()), "unknown key {key}");
    }
    fs::write(&path, &contents).unwrap();
    let stdin = json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan",
        "ipam": {"type": "hereabouts", "range": "10.1.0.0/24", "configuration_path": path}});
    let stdin = serde_json::to_vec(&stdin).unwrap();
    let cfg = load_with_paths(&Input { stdin: &stdin, cni_args: "" }, &[]).unwrap();
    assert_eq!(cfg.flat_file.as_deref(), Some(path.as_path()));
    let kubeconfig = cfg.mode.kube().and_then(|k| k.kubeconfig.as_deref());
    assert_eq!(kubeconfig, Some(Path::new("/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig")));
    assert_eq!(cfg.log_level, LogLevel::Verbose);
    assert_eq!(cfg.log_file.as_deref(), Some(Path::new("/var/log/hereabouts.log")));
    assert_eq!(cfg.reconciler_cron_expression.as_deref(), Some("30 4 * * *"));
    assert!(cfg.ignored.iter().any(|k| k.starts_with("datastore")), "{:?}", cfg.ignored);
}

#[test]
fn minimal_flat_file_has_no_optional_keys() {
    let contents = render::flat_file(&render::FlatFile {
        kubeconfig: "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig",
        log_level: LogLevel::Info,
        log_file: None,
        reconciler_cron_expression: None,
    });
    let doc: Value = serde_json::from_slice(&contents).unwrap();
    assert_eq!(
        doc,
        json!({"datastore": "kubernetes", "log_level": "info",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig"}})
    );
}

#[test]
fn server_url_brackets_ipv6_hosts() {
    assert_eq!(render::server_url("10.96.0.1", "443").unwrap(), "https://10.96.0.1:443");
    assert_eq!(render::server_url("fd00:10:96::1", "443").unwrap(), "https://[fd00:10:96::1]:443");
    assert_eq!(render::server_url("[fd00::1]", "6443").unwrap(), "https://[fd00::1]:6443");
    assert_eq!(render::server_url("api.example", "6443").unwrap(), "https://api.example:6443");
    assert!(render::server_url("", "443").unwrap_err().contains("KUBERNETES_SERVICE_HOST"));
    assert!(render::server_url("10.0.0.1", "https").unwrap_err().contains("KUBERNETES_SERVICE_PORT"));
    assert!(render::server_url("10.0.0.1", "0").is_err());
}

#[test]
fn flag_values_are_checked() {
    assert_eq!(render::parse_interval("200ms").unwrap(), Duration::from_millis(200));
    assert_eq!(render::parse_interval("2s").unwrap(), Duration::from_secs(2));
    assert_eq!(render::parse_interval("3").unwrap(), Duration::from_secs(3));
    assert_eq!(render::parse_interval("1.5s").unwrap(), Duration::from_millis(1500));
    assert_eq!(render::parse_interval("1m").unwrap(), Duration::from_secs(60));
    for bad in ["", "s", "2x", "-1s", "0s", "1ms", "2h", "1e3s"] {
        assert!(render::parse_interval(bad).is_err(), "{bad:?} accepted");
    }
    assert!(render::parse_cron("30 4 * * *").is_ok());
    for bad in ["", "* * * *", "0 30 4 * * *", "61 * * * *", "@daily"] {
        assert!(render::parse_cron(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(render::parse_log_level("DEBUG").unwrap(), LogLevel::Debug);
    assert!(render::parse_log_level("trace").is_err());
    assert!(render::parse_absolute("tmp/x").is_err());
    assert!(render::check_namespace("kube-system").is_ok());
    for bad in ["", "Kube", "-a", "a_b", &"a".repeat(64)] {
        assert!(render::check_namespace(bad).is_err(), "{bad:?} accepted");
    }
    assert!(render::check_server("https://10.0.0.1:443").is_ok());
    assert!(render::check_server("10.0.0.1:443").is_err());

    assert_eq!(render::parse_lifetime("24h").unwrap(), Duration::from_secs(86_400));
    assert_eq!(render::parse_lifetime("10m").unwrap(), Duration::from_secs(600));
    assert_eq!(render::parse_lifetime("600.7").unwrap(), Duration::from_secs(600), "whole seconds");
    for bad in ["599s", "9m", "169h", "1d", ""] {
        assert!(render::parse_lifetime(bad).is_err(), "{bad:?} accepted");
    }
    assert!(render::parse_lifetime("5m").unwrap_err().contains("refuses shorter"));
    assert_eq!(render::parse_fraction("0.5").unwrap(), 0.5);
    assert_eq!(render::parse_fraction("0.001").unwrap(), 0.001);
    for bad in ["0", "1", "0.95", "-0.5", "half", "NaN"] {
        assert!(render::parse_fraction(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(render::parse_service_account("hereabouts-cni").unwrap(), "hereabouts-cni");
    assert!(render::parse_service_account("cni.v2").is_ok());
    for bad in ["", "Hereabouts", "-cni", "cni-", "a..b", "a_b"] {
        assert!(render::parse_service_account(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn refresh_comes_after_the_fraction_of_the_granted_lifetime() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let sent = Timestamp::from_second(1_800_000_000).unwrap();
    let day = sent + SignedDuration::from_hours(24);
    assert_eq!(refresh_after(sent, day, 0.5), Duration::from_secs(12 * 3600));
    assert_eq!(refresh_after(sent, day, 0.25), Duration::from_secs(6 * 3600));
    // the API server granted less than asked (--service-account-max-token-expiration): its expiry counts
    let hour = sent + SignedDuration::from_hours(1);
    assert_eq!(refresh_after(sent, hour, 0.5), Duration::from_secs(1800));
    // never sooner than a second, even for an expiry already past by this node's clock
    assert_eq!(refresh_after(sent, sent - SignedDuration::from_secs(5), 0.5), Duration::from_secs(1));
    let ten_minutes = sent + SignedDuration::from_mins(10);
    assert_eq!(refresh_after(sent, ten_minutes, 0.005), Duration::from_secs(3));
}

#[test]
fn minted_debug_hides_the_token() {
    let minted = Minted {
        token: "s3cr3t".into(),
        expires: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        refresh_after: Duration::from_secs(1),
    };
    let shown = format!("{minted:?}");
    assert!(!shown.contains("s3cr3t"), "{shown}");
}

#[test]
fn defaults_and_flags() {
    let args = parse_args(&[]).unwrap();
    assert_eq!(args.source_binary, Path::new("/usr/local/bin/hereabouts"));
    assert_eq!(args.cni_bin_dir, Path::new("/host/opt/cni/bin"));
    assert_eq!(args.cni_conf_dir, Path::new("/host/etc/cni/net.d"));
    assert_eq!(args.host_cni_conf_dir, "/etc/cni/net.d");
    assert_eq!(args.token_file, Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token"));
    assert_eq!(args.ca_file, Path::new("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"));
    assert_eq!(args.namespace_file, Path::new("/var/run/secrets/kubernetes.io/serviceaccount/namespace"));
    assert_eq!(args.watch_interval, Duration::from_secs(2));
    assert_eq!(args.log_level, LogLevel::Info);
    assert_eq!(args.cni_service_account, "hereabouts-cni");
    assert_eq!(args.cni_token_lifetime, Duration::from_secs(24 * 3600));
    assert_eq!(args.cni_token_refresh_fraction, 0.5);
    assert!(!args.once);
    let args = parse_args(&["--cni-token-lifetime", "10m", "--cni-token-refresh-fraction", "0.005"]).unwrap();
    assert_eq!((args.cni_token_lifetime, args.cni_token_refresh_fraction), (Duration::from_secs(600), 0.005));
    assert!(parse_args(&["--cni-token-lifetime", "1m"]).is_err());
    assert!(parse_args(&["--cni-service-account", "Not_A_Name"]).is_err());
    assert!(parse_args(&["--once", "--watch-interval", "200ms"]).unwrap().once);
    assert!(parse_args(&["--watch-interval", "soon"]).is_err());
    assert!(parse_args(&["--host-cni-conf-dir", "etc/cni"]).is_err());
    assert!(parse_args(&["--reconciler-cron-expression", "every day"]).is_err());
}

/// An installer over `dir` with fake service-account files.
fn installer(dir: &TempDir, extra: &[&str]) -> Installer {
    fs::write(dir.join("token"), "tok-1\n").unwrap();
    fs::write(dir.join("ca.crt"), creds("").ca).unwrap();
    fs::write(dir.join("namespace"), "pools-ns").unwrap();
    fs::write(dir.join("source"), b"\x7fELF fake plugin").unwrap();
    let paths = [
        ("--source-binary", dir.join("source")),
        ("--cni-bin-dir", dir.join("bin")),
        ("--cni-conf-dir", dir.join("net.d")),
        ("--token-file", dir.join("token")),
        ("--ca-file", dir.join("ca.crt")),
        ("--namespace-file", dir.join("namespace")),
    ];
    let mut argv: Vec<String> = Vec::new();
    for (flag, path) in paths {
        argv.push(flag.into());
        argv.push(path.to_str().unwrap().into());
    }
    if !extra.contains(&"--node-name") {
        argv.extend(["--node-name".to_string(), "worker-1".to_string()]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Installer::with_env(parse_args(&argv).unwrap(), service_env).unwrap()
}

/// The kubelet's service variables of a pod.
fn service_env(name: &str) -> Option<String> {
    match name {
        "KUBERNETES_SERVICE_HOST" => Some("fd00:96::1".to_string()),
        "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
        _ => None,
    }
}

/// The token is bound to the node's Node: without its name there is nothing to bind it to, and a bad one is named.
#[test]
fn the_node_name_is_required_and_checked() {
    let dir = TempDir::new();
    fs::write(dir.join("namespace"), "pools-ns").unwrap();
    let namespace = dir.join("namespace");
    let args = |extra: &[&str]| {
        let mut argv = vec!["--namespace-file", namespace.to_str().unwrap()];
        argv.extend(extra);
        parse_args(&argv).unwrap()
    };
    for extra in [&[][..], &["--node-name", "  "][..]] {
        let err = Installer::with_env(args(extra), service_env).unwrap_err().to_string();
        assert!(err.contains("--node-name (NODE_NAME") && err.contains("bound to this node's Node"), "{err}");
    }
    let err = Installer::with_env(args(&["--node-name", "Worker_1"]), service_env).unwrap_err().to_string();
    assert!(err.contains("--node-name") && err.contains("not a Node name"), "{err}");
    let inst = Installer::with_env(args(&["--node-name", "worker-1.example"]), service_env).unwrap();
    assert_eq!(inst.minter.node, "worker-1.example", "the Node the token is bound to");
    assert_eq!(inst.node_file.1, "worker-1.example", "the name the plugin records");
}

#[test]
fn install_then_poll_follows_the_ca_and_restores_removed_files() {
    let dir = TempDir::new();
    let inst = installer(&dir, &[]);
    assert_eq!(inst.server, "https://[fd00:96::1]:443");
    assert_eq!(inst.namespace, "pools-ns");
    assert_eq!(inst.minter.namespace, "pools-ns", "the CNI token is minted where the pools live");
    assert_eq!(inst.minter.service_account, "hereabouts-cni");
    assert_eq!(inst.minter.node, "worker-1");
    let pod = inst.read_credentials().unwrap();
    assert_eq!(pod.token, "tok-1");
    let cni = Credentials { token: "cni-1".into(), ca: pod.ca.clone() };
    inst.install(Some(&cni)).unwrap();
    let conf = dir.join("net.d/hereabouts.d");
    assert_eq!(names(&conf), ["hereabouts.conf", "hereabouts.kubeconfig", "nodename"], "no temp file is left");
    assert_eq!(mode(&conf.join("hereabouts.kubeconfig")), 0o600);
    assert_eq!(mode(&conf.join("hereabouts.conf")), 0o644);
    assert_eq!(mode(&dir.join("bin/hereabouts")), 0o755);
    assert_eq!(fs::read(dir.join("bin/hereabouts")).unwrap(), fs::read(dir.join("source")).unwrap());
    let kc = fs::read_to_string(conf.join("hereabouts.kubeconfig")).unwrap();
    assert!(kc.contains("\"cni-1\"") && !kc.contains("tok-1"), "the pod's own token never reaches the host: {kc}");

    let mut written = Some(cni.clone());
    let ino = fs::metadata(conf.join("hereabouts.kubeconfig")).unwrap().ino();
    assert_eq!(inst.poll(&mut written).unwrap(), pod, "nothing changed");
    assert_eq!(fs::metadata(conf.join("hereabouts.kubeconfig")).unwrap().ino(), ino, "not rewritten");

    // a rotated pod token is only read (the caller mints with it); the kubeconfig keeps the CNI token
    fs::write(dir.join("token"), "tok-2").unwrap();
    assert_eq!(inst.poll(&mut written).unwrap().token, "tok-2");
    assert_eq!(fs::metadata(conf.join("hereabouts.kubeconfig")).unwrap().ino(), ino, "not rewritten");

    // a new CA is written at once, with the token the kubeconfig holds
    let ca2 = b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n".to_vec();
    fs::write(dir.join("ca.crt"), &ca2).unwrap();
    assert_eq!(inst.poll(&mut written).unwrap().ca, ca2);
    assert_eq!(written, Some(Credentials { token: "cni-1".into(), ca: ca2.clone() }));
    let kc = fs::read_to_string(conf.join("hereabouts.kubeconfig")).unwrap();
    let embedded = base64::engine::general_purpose::STANDARD.encode(&ca2);
    assert!(kc.contains(&embedded) && kc.contains("\"cni-1\""), "{kc}");
    assert_eq!(mode(&conf.join("hereabouts.kubeconfig")), 0o600);

    fs::remove_file(conf.join("hereabouts.kubeconfig")).unwrap();
    fs::remove_file(conf.join("hereabouts.conf")).unwrap();
    fs::remove_file(dir.join("bin/hereabouts")).unwrap();
    inst.poll(&mut written).unwrap();
    assert_eq!(names(&conf), ["hereabouts.conf", "hereabouts.kubeconfig", "nodename"]);
    assert!(dir.join("bin/hereabouts").is_file());
    assert!(fs::read_to_string(conf.join("hereabouts.kubeconfig")).unwrap().contains("\"cni-1\""));
}

#[test]
fn without_a_token_an_earlier_kubeconfig_stays_and_none_is_made_up() {
    let dir = TempDir::new();
    let inst = installer(&dir, &[]);
    let conf = dir.join("net.d/hereabouts.d");
    // first start, no token: the binary, and no flat file naming a kubeconfig that is not there
    inst.install(None).unwrap();
    assert!(dir.join("bin/hereabouts").is_file());
    assert_eq!(names(&conf), ["nodename"], "the node's name, and neither kubeconfig nor flat file");
    let mut written = None;
    inst.poll(&mut written).unwrap();
    assert_eq!(names(&conf), ["nodename"], "a poll does not make up a kubeconfig either");

    // a restart with a kubeconfig of an earlier run: it stays, and the flat file names it
    let earlier = Credentials { token: "cni-earlier".into(), ca: creds("").ca };
    inst.install(Some(&earlier)).unwrap();
    fs::remove_file(conf.join("hereabouts.conf")).unwrap();
    let before = fs::read(conf.join("hereabouts.kubeconfig")).unwrap();
    inst.install(None).unwrap();
    assert_eq!(fs::read(conf.join("hereabouts.kubeconfig")).unwrap(), before);
    assert!(conf.join("hereabouts.conf").is_file());

    inst.store(&Credentials { token: "cni-new".into(), ca: creds("").ca }).unwrap();
    assert!(fs::read_to_string(conf.join("hereabouts.kubeconfig")).unwrap().contains("\"cni-new\""));
}

#[test]
fn unreadable_credentials_are_named() {
    let dir = TempDir::new();
    let inst = installer(&dir, &[]);
    fs::write(dir.join("token"), " \n").unwrap();
    let err = format!("{:#}", inst.read_credentials().unwrap_err());
    assert!(err.contains("token file") && err.contains(dir.join("token").to_str().unwrap()), "{err}");
    fs::remove_file(dir.join("token")).unwrap();
    let err = format!("{:#}", inst.read_credentials().unwrap_err());
    assert!(err.contains("read token file"), "{err}");
    fs::write(dir.join("token"), "tok").unwrap();
    fs::write(dir.join("ca.crt"), "\n").unwrap();
    let err = format!("{:#}", inst.read_credentials().unwrap_err());
    assert!(err.contains("CA file") && err.contains("empty"), "{err}");
}

#[test]
fn write_if_changed_sets_the_exact_mode_and_skips_same_content() {
    let dir = TempDir::new();
    let path = dir.join("secret");
    assert!(files::write_if_changed(&path, b"one", 0o600).unwrap());
    assert_eq!(mode(&path), 0o600);
    let ino = fs::metadata(&path).unwrap().ino();
    assert!(!files::write_if_changed(&path, b"one", 0o600).unwrap());
    assert_eq!(fs::metadata(&path).unwrap().ino(), ino, "not rewritten");
    assert!(files::write_if_changed(&path, b"one", 0o640).unwrap(), "a wrong mode is rewritten");
    assert_eq!(mode(&path), 0o640);
    assert!(files::write_if_changed(&path, b"two", 0o640).unwrap());
    assert_eq!(fs::read(&path).unwrap(), b"two");
    assert_eq!(names(&dir.0), ["secret"]);
}

#[test]
fn write_into_a_missing_directory_names_the_file() {
    let dir = TempDir::new();
    let err = format!("{:#}", files::write_if_changed(&dir.join("nope/file"), b"x", 0o644).unwrap_err());
    assert!(err.contains("nope/.file.tmp-"), "{err}");
}

#[test]
fn install_binary_copies_only_when_the_bytes_differ() {
    let dir = TempDir::new();
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    fs::write(&src, vec![7u8; 200_000]).unwrap();
    assert!(files::install_binary(&src, &dst).unwrap());
    assert_eq!(mode(&dst), 0o755);
    let ino = fs::metadata(&dst).unwrap().ino();
    assert!(!files::install_binary(&src, &dst).unwrap());
    assert_eq!(fs::metadata(&dst).unwrap().ino(), ino);

    fs::set_permissions(&dst, fs::Permissions::from_mode(0o700)).unwrap();
    assert!(!files::install_binary(&src, &dst).unwrap(), "same bytes: only the mode is fixed");
    assert_eq!(mode(&dst), 0o755);
    assert_eq!(fs::metadata(&dst).unwrap().ino(), ino);

    let mut changed = vec![7u8; 200_000];
    changed[150_000] = 8;
    fs::write(&src, &changed).unwrap();
    assert!(files::install_binary(&src, &dst).unwrap(), "same size, different bytes");
    assert_eq!(fs::read(&dst).unwrap(), changed);
    assert_ne!(fs::metadata(&dst).unwrap().ino(), ino, "replaced by rename, not written in place");

    let err = format!("{:#}", files::install_binary(&dir.join("missing"), &dst).unwrap_err());
    assert!(err.contains("source binary") && err.contains("missing"), "{err}");
}

#[test]
fn stale_temp_files_are_swept() {
    let dir = TempDir::new();
    let target = dir.join("hereabouts");
    let stale = dir.join(".hereabouts.tmp-1-2-3");
    let fresh = dir.join(".hereabouts.tmp-4-5-6");
    let other = dir.join(".other.tmp-1-2-3");
    for p in [&stale, &fresh, &other] {
        fs::write(p, "x").unwrap();
    }
    let old = SystemTime::now() - Duration::from_secs(3600);
    for p in [&stale, &other] {
        fs::File::options().write(true).open(p).unwrap().set_modified(old).unwrap();
    }
    files::sweep_stale_temps(&target);
    assert_eq!(names(&dir.0), [".hereabouts.tmp-4-5-6", ".other.tmp-1-2-3"]);
}

#[test]
fn the_node_name_is_written_beside_the_flat_file_and_put_back() {
    let dir = TempDir::new();
    let inst = installer(&dir, &["--node-name", " worker-3 "]);
    let pod = inst.read_credentials().unwrap();
    let cni = Credentials { token: "cni-1".into(), ca: pod.ca.clone() };
    inst.install(Some(&cni)).unwrap();
    let conf = dir.join("net.d/hereabouts.d");
    assert_eq!(names(&conf), ["hereabouts.conf", "hereabouts.kubeconfig", "nodename"]);
    assert_eq!(fs::read_to_string(conf.join("nodename")).unwrap(), "worker-3\n");
    assert_eq!(mode(&conf.join("nodename")), 0o644);
    fs::remove_file(conf.join("nodename")).unwrap();
    inst.poll(&mut Some(cni)).unwrap();
    assert_eq!(fs::read_to_string(conf.join("nodename")).unwrap(), "worker-3\n", "put back");
}

#[test]
fn install_as_whereabouts_writes_the_same_binary_under_that_name_too() {
    let dir = TempDir::new();
    let plain = installer(&dir, &[]);
    plain.install(None).unwrap();
    assert_eq!(names(&dir.join("bin")), ["hereabouts"], "only on request");
    let inst = installer(&dir, &["--install-as-whereabouts"]);
    inst.install(None).unwrap();
    assert_eq!(names(&dir.join("bin")), ["hereabouts", "whereabouts"]);
    assert_eq!(fs::read(dir.join("bin/whereabouts")).unwrap(), fs::read(dir.join("source")).unwrap());
    assert_eq!(mode(&dir.join("bin/whereabouts")), 0o755);
    fs::remove_file(dir.join("bin/whereabouts")).unwrap();
    inst.poll(&mut None).unwrap();
    assert!(dir.join("bin/whereabouts").is_file(), "put back");
}
