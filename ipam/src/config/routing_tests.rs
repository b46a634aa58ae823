//! Unit tests of the routing keys: the routing-table datastore and `announce_routes`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::tests::{merge_into, netconf};
use super::*;

fn routetable(patch: Value) -> Value {
    let mut ipam = json!({"type": "hereabouts", "datastore": "routetable", "range": "198.18.0.0/28"});
    merge_into(&mut ipam, patch);
    ipam
}

fn load(ipam: Value) -> Result<IpamConfig, ConfigError> {
    load_with_paths(&Input { stdin: &netconf(ipam), cni_args: "" }, &[])
}

/// Loads `ipam` on a node whose own flat file holds `node`.
fn load_on_node(ipam: Value, node: Value) -> Result<IpamConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("hereabouts.conf");
    std::fs::write(&flat, node.to_string()).unwrap();
    load_with_paths(&Input { stdin: &netconf(ipam), cni_args: "" }, &[flat])
}

fn refused(ipam: Value) -> ConfigError {
    load(ipam).unwrap_err()
}

/// The routing-table mode of `c`.
fn route_table(c: &IpamConfig) -> &RouteTable {
    match &c.mode {
        Mode::RouteTable(t) => t,
        other => panic!("the routing table, not {other:?}"),
    }
}

/// The routes a Kubernetes-mode config announces.
fn announced(c: &IpamConfig) -> Option<&HostRoutes> {
    c.mode.kube().expect("a mode on the API server").announce.as_ref()
}

#[test]
fn the_routing_table_datastore_needs_no_kubeconfig_and_has_the_defaults() {
    let c = load(routetable(json!({}))).unwrap();
    assert_eq!(
        route_table(&c).routes,
        HostRoutes { table: 254, protocol: 192, device: None, state_dir: PathBuf::from(DEFAULT_STATE_DIR) }
    );
    let claiming = &route_table(&c).claiming;
    assert_eq!(
        (claiming.propagation, claiming.requested_retry),
        (Duration::from_millis(100), Duration::from_millis(100))
    );
    assert_eq!((claiming.exclude_first, claiming.exclude_last), (0, 0));
    assert_eq!(c.mode.kube(), None, "no API server, no kubeconfig");

    assert_eq!(
        route_table(&c).daemon,
        Daemon { socket: PathBuf::from("/run/bird/bird.ctl"), settle: Duration::from_secs(3) }
    );

    let c = load_on_node(
        routetable(json!({"propagation_timeout_ms": 250, "requested_address_retry_ms": 50, "exclude_first": 2,
            "exclude_last": 3})),
        json!({"route_table": 100, "route_protocol": 201, "route_device": "vxlan0", "route_state_dir": "/run/hereabouts",
            "bird_socket": "/run/bird/b.ctl", "bird_settle_ms": 500}),
    )
    .unwrap();
    let routes = &route_table(&c).routes;
    assert_eq!((routes.table, routes.protocol, routes.device.as_deref()), (100, 201, Some("vxlan0")));
    assert_eq!(routes.state_dir, Path::new("/run/hereabouts"));
    assert_eq!(
        route_table(&c).daemon,
        Daemon { socket: PathBuf::from("/run/bird/b.ctl"), settle: Duration::from_millis(500) }
    );
    let claiming = &route_table(&c).claiming;
    assert_eq!(claiming.propagation, Duration::from_millis(250));
    assert_eq!((claiming.exclude_first, claiming.exclude_last), (2, 3));
}

#[test]
fn whereabouts_datastore_values_change_nothing_and_others_are_refused() {
    for value in ["kubernetes", "etcd"] {
        let c = load(json!({"type": "whereabouts", "range": "10.0.0.0/24", "datastore": value})).unwrap();
        assert!(matches!(&c.mode, Mode::Pools(p) if p.kube.announce.is_none()), "{:?}", c.mode);
        assert_eq!(c.ignored, ["ipam.datastore"]);
    }
    let e = refused(routetable(json!({"datastore": "routing-table"})));
    assert_eq!(e.code(), 7);
    assert_eq!(
        e.to_string(),
        r#"ipam.datastore: "routing-table": expected "kubernetes" (the default) or "routetable""#
    );
}

#[test]
fn keys_of_another_mode_are_refused_with_code_7() {
    let kube = |patch: Value| {
        let mut ipam = json!({"type": "hereabouts", "range": "10.0.0.0/24"});
        merge_into(&mut ipam, patch);
        refused(ipam)
    };
    let cases = [
        (kube(json!({"exclude_first": 1})), "ipam.exclude_first: only with \"datastore\": \"routetable\""),
        (
            kube(json!({"propagation_timeout_ms": 5})),
            "ipam.propagation_timeout_ms: only with \"datastore\": \"routetable\"",
        ),
        (
            kube(json!({"route_table": 100})),
            "ipam.route_table: a node setting: only the node's own flat file sets it, not the network's config",
        ),
        (
            refused(routetable(json!({"bird_socket": "/var/run/docker.sock"}))),
            "ipam.bird_socket: a node setting: only the node's own flat file sets it, not the network's config",
        ),
        (
            refused(routetable(json!({"route_state_dir": "/var/lib/cni/hereabouts/routes"}))),
            "ipam.route_state_dir: a node setting: only the node's own flat file sets it, not the network's config",
        ),
        (
            refused(routetable(json!({"announce_routes": true}))),
            "ipam.announce_routes: the routing-table datastore announces every address; the key is for the Kubernetes datastore",
        ),
        (
            refused(routetable(json!({"reuse_cooldown_seconds": 5}))),
            "ipam.reuse_cooldown_seconds: not with \"datastore\": \"routetable\": it needs the API server, which that datastore does not use",
        ),
        (
            refused(routetable(json!({"allocation_strategy": "lowest"}))),
            "ipam.allocation_strategy: the routing-table datastore always picks at random (two nodes must not try the same address first)",
        ),
        (
            refused(routetable(json!({"exclude_first": 10, "exclude_last": 4}))),
            "ipam.exclude_first: exclude_first 10 and exclude_last 4 leave no address of range 198.18.0.0/28 (14 usable)",
        ),
        (
            refused(routetable(json!({"route_protocol": 4}))),
            "ipam.route_protocol: 4: must be 5 to 255 (0 to 4 are the kernel's)",
        ),
        (
            refused(routetable(json!({"route_table": 255}))),
            "ipam.route_table: 255: not a table for host routes (254 is main)",
        ),
        (
            refused(routetable(json!({"route_device": "a/b"}))),
            "ipam.route_device: \"a/b\" is not a link name (1 to 15 characters, no '/')",
        ),
        (
            refused(routetable(json!({"route_state_dir": "rel"}))),
            "ipam.route_state_dir: \"rel\" is not an absolute path",
        ),
        (
            refused(routetable(json!({"propagation_timeout_ms": 60001}))),
            "ipam.propagation_timeout_ms: 60001: must be 0 to 60000 (milliseconds)",
        ),
        (
            refused(routetable(json!({"bird_socket": "bird.ctl"}))),
            "ipam.bird_socket: \"bird.ctl\" is not an absolute path",
        ),
        (
            refused(routetable(json!({"bird_settle_ms": 60001}))),
            "ipam.bird_settle_ms: 60001: must be 0 to 60000 (milliseconds)",
        ),
    ];
    for (e, said) in cases {
        assert_eq!(e.code(), 7, "{e}");
        assert_eq!(e.to_string(), said);
    }
    for slow in [json!({"node_slice_size": "/30"}), json!({"pod_ranges": true}), json!({"sticky_statefulset": true})] {
        let e = refused(routetable(slow.clone()));
        assert!(e.to_string().contains("it needs the API server"), "{slow}: {e}");
    }
}

#[test]
fn announcing_keeps_the_kubernetes_datastore_and_uses_the_route_keys() {
    let node = json!({"route_protocol": 201, "bird_socket": "/run/b.ctl"});
    let c = load_on_node(json!({"type": "hereabouts", "range": "10.0.0.0/24", "announce_routes": true}), node.clone())
        .unwrap();
    assert!(matches!(c.mode, Mode::Pools(_)), "{:?}", c.mode);
    assert_eq!(announced(&c).map(|r| (r.table, r.protocol)), Some((254, 201)));
    let c = load(json!({"type": "hereabouts", "range": "10.0.0.0/24", "announce_routes": false})).unwrap();
    assert_eq!(announced(&c), None);
    // the node's keys are every network's on the node: one that uses none of them is not refused for them
    let c = load_on_node(json!({"type": "hereabouts", "range": "10.0.0.0/24"}), node).unwrap();
    assert!(matches!(&c.mode, Mode::Pools(p) if p.kube.announce.is_none()), "{:?}", c.mode);
}

#[test]
fn node_keys_come_from_the_nodes_own_flat_file_only() {
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("flat.conf");
    std::fs::write(
        &flat,
        r#"{"datastore": "routetable", "route_protocol": 199, "propagation_timeout_ms": 300, "route_state_dir": "/run/h"}"#,
    )
    .unwrap();
    let stdin = netconf(json!({"type": "hereabouts", "range": "198.18.0.0/28", "propagation_timeout_ms": 200}));
    let c = load_with_paths(&Input { stdin: &stdin, cni_args: "" }, std::slice::from_ref(&flat)).unwrap();
    assert_eq!(route_table(&c).routes.protocol, 199);
    assert_eq!(route_table(&c).claiming.propagation, Duration::from_millis(200), "a network key: inline wins");

    // a node key inline is refused, even where the node's file sets it too
    let stdin = netconf(json!({"type": "hereabouts", "range": "198.18.0.0/28", "route_protocol": 198}));
    let e = load_with_paths(&Input { stdin: &stdin, cni_args: "" }, std::slice::from_ref(&flat)).unwrap_err();
    assert_eq!(e.code(), 7);
    assert_eq!(
        e.to_string(),
        "ipam.route_protocol: a node setting: only the node's own flat file sets it, not the network's config"
    );

    // a flat file the network's config chose (any file on the node, one a pod wrote included) sets none
    let chosen = json!({"type": "hereabouts", "range": "198.18.0.0/28", "configuration_path": flat});
    let e = load_with_paths(&Input { stdin: &netconf(chosen.clone()), cni_args: "" }, &[]).unwrap_err();
    assert_eq!(e.code(), 7);
    assert!(
        e.to_string().ends_with("a node setting: only the node's own flat file sets it, not one the network's config names with configuration_path"),
        "{e}"
    );
    assert!(e.to_string().starts_with("route_"), "{e}");

    // DEL of a config ADD would refuse still finds the host routes, where the node keeps them
    let stdin = netconf(routetable(json!({"rangeStart": "198.18.0.2", "route_state_dir": "/tmp/elsewhere"})));
    let r = load_for_release_with_paths(&Input { stdin: &stdin, cni_args: "" }, std::slice::from_ref(&flat));
    assert!(matches!(&r.mode, ReleaseMode::RouteTable(h) if h.state_dir == Path::new("/run/h")), "{:?}", r.mode);
    assert!(!r.warnings.is_empty());
    let r = load_for_release_with_paths(&Input { stdin: &netconf(chosen), cni_args: "" }, &[]);
    assert!(
        matches!(&r.mode, ReleaseMode::RouteTable(h) if h.state_dir == Path::new(DEFAULT_STATE_DIR)),
        "{:?}",
        r.mode
    );

    // the reconciler reads the node's settings from the same file
    let node = node_routing(&flat).unwrap();
    assert!(node.route_table && !node.announce);
    assert_eq!((node.routes.protocol, node.routes.state_dir.as_path()), (199, Path::new("/run/h")));
    assert_eq!(node.daemon.socket, Path::new(DEFAULT_BIRD_SOCKET));
}
