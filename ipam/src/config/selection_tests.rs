//! Unit tests of ranges chosen per pod: the keys' refusals, and the choice from annotations and node labels.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::tests::netconf;
use super::*;

const ARGS: &str = "K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0";

fn load(ipam: Value, cni_args: &str) -> Result<IpamConfig, ConfigError> {
    load_with_paths(&Input { stdin: &netconf(ipam), cni_args }, &[])
}

/// blue and red, ordinary; green only on zone=b nodes.
fn three() -> IpamConfig {
    load(
        json!({"type": "hereabouts", "pod_ranges": true, "ipRanges": [
            {"range": "198.18.1.0/24", "name": "blue"},
            {"range": "198.18.2.0/24", "name": "red"},
            {"range": "198.18.3.0/24", "name": "green", "node_selector": "zone=b"},
        ]}),
        ARGS,
    )
    .unwrap()
}

/// The one-pool-per-range settings of `cfg`.
fn pools(cfg: &IpamConfig) -> &Pools {
    match &cfg.mode {
        Mode::Pools(p) => p,
        other => panic!("one pool per range, not {other:?}"),
    }
}

/// `cfg` narrowed to what `facts` choose on `node`, as an ADD narrows it.
fn choose(cfg: &IpamConfig, node: &str, facts: &RangeFacts) -> Result<(IpamConfig, Pools), ConfigError> {
    let keep = pools(cfg).selection.choose(cfg, node, facts)?;
    Ok(pools(cfg).narrowed(cfg, &keep, facts.statefulset.clone()))
}

fn zone(z: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([("zone".to_string(), z.to_string())]))
}

fn chosen((cfg, _): &(IpamConfig, Pools)) -> Vec<String> {
    cfg.ranges.iter().map(|r| r.cidr().to_string()).collect()
}

fn facts(pod: Option<&str>, namespace: Option<&str>, labels: Option<BTreeMap<String, String>>) -> RangeFacts {
    RangeFacts {
        pod: pod.map(str::to_string),
        namespace: namespace.map(str::to_string),
        node_labels: labels,
        statefulset: None,
    }
}

#[test]
fn the_keys_are_read_and_checked() {
    let cfg = three();
    assert!(pools(&cfg).selection.by_pod && pools(&cfg).selection.reads_node());
    assert_eq!(pools(&cfg).selection.names, [Some("blue".into()), Some("red".into()), Some("green".into())]);
    let plain = load(json!({"type": "hereabouts", "range": "198.18.1.0/24"}), ARGS).unwrap();
    assert!(!pools(&plain).selection.is_active(), "a Whereabouts config reads nothing more");
    let cases = [
        (json!([{"range": "198.18.1.0/24", "name": "Blue"}]), "ipam.ipRanges[0].name", 7),
        (
            json!([{"range": "198.18.1.0/24", "name": "a"}, {"range": "198.18.2.0/24", "name": "a"}]),
            "ipam.ipRanges[1].name",
            7,
        ),
        (json!([{"range": "198.18.1.0/24", "node_selector": "zone in b"}]), "ipam.ipRanges[0].node_selector", 7),
        (json!([{"range": "198.18.1.0/24", "node_selector": " , "}]), "ipam.ipRanges[0].node_selector", 7),
        (json!([{"range": "198.18.1.0/24", "nodeSelector": "zone=a"}]), "ipam.ipRanges[0].nodeSelector", 2),
    ];
    for (ranges, key, code) in cases {
        let err = load(json!({"type": "hereabouts", "ipRanges": ranges}), ARGS).unwrap_err();
        assert!(err.to_string().starts_with(key), "{ranges}: {err}");
        assert_eq!(err.code().number(), code, "{ranges}: {err}");
    }
    let err = load(json!({"type": "hereabouts", "pod_ranges": "yes", "range": "198.18.1.0/24"}), ARGS).unwrap_err();
    assert_eq!(err.code().number(), 6, "{err}");
    let provider = json!({"url": "https://127.0.0.1:1", "ca_file": "/ca.pem", "parent_interface": "eth0"});
    let err = load(
        json!({"type": "hereabouts", "pod_ranges": true, "range": "198.18.1.0/24", "iaas_provider": provider}),
        ARGS,
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("ipam.pod_ranges: not with ipam.iaas_provider"), "{err}");
}

#[test]
fn the_pod_annotation_then_the_namespace_then_every_range_that_serves_the_node() {
    let cfg = three();
    let on_a = |pod, ns| choose(&cfg, "n1", &facts(pod, ns, zone("a"))).map(|c| chosen(&c));
    assert_eq!(on_a(Some(r#"["red"]"#), Some("blue")).unwrap(), ["198.18.2.0/24"]);
    assert_eq!(on_a(None, Some("blue")).unwrap(), ["198.18.1.0/24"]);
    assert_eq!(on_a(None, None).unwrap(), ["198.18.1.0/24", "198.18.2.0/24"], "green is for zone=b only");
    // a comma list, a CIDR, config order kept, repeats dropped
    assert_eq!(on_a(Some("198.18.2.0/24, blue,red"), None).unwrap(), ["198.18.1.0/24", "198.18.2.0/24"]);
    // the object form: this network's entry, else the namespace's default
    assert_eq!(on_a(Some(r#"{"net1": ["red"], "net2": ["x"]}"#), Some("blue")).unwrap(), ["198.18.2.0/24"]);
    assert_eq!(on_a(Some(r#"{"net2": ["x"]}"#), Some("blue")).unwrap(), ["198.18.1.0/24"]);
    let on_b = choose(&cfg, "n2", &facts(Some("green"), None, zone("b"))).unwrap();
    assert_eq!(chosen(&on_b), ["198.18.3.0/24"]);
    assert_eq!(on_b.1.selection.names, [Some("green".to_string())]);
}

#[test]
fn a_choice_that_cannot_be_honoured_is_a_clear_error() {
    let cfg = three();
    let err = |f: RangeFacts| choose(&cfg, "n1", &f).unwrap_err();
    let e = err(facts(Some("purple"), None, zone("a")));
    assert_eq!(e.code().number(), 7);
    assert_eq!(
        e.to_string(),
        "annotation hereabouts.cni.cncf.io/ranges of pod team-a/web-0: \"purple\" names no range of network net1 \
         (its ranges: blue (198.18.1.0/24), red (198.18.2.0/24), green (198.18.3.0/24))"
    );
    let e = err(facts(None, Some("purple"), zone("a")));
    assert!(e.to_string().starts_with("annotation hereabouts.cni.cncf.io/ranges of namespace team-a: \"purple\""));
    let e = err(facts(Some("green"), None, zone("a")));
    assert!(
        e.to_string()
            .ends_with("range green (198.18.3.0/24) serves only nodes matching \"zone=b\"; node n1 does not match it"),
        "{e}"
    );
    let e = err(facts(Some("green"), None, None));
    assert!(e.to_string().ends_with("node n1 is not a Node the API server knows"), "{e}");
    for bad in ["[]", "[\"blue\", \"\"]", "[1]", "{\"net1\": \"blue\"}", ",", "{"] {
        let e = err(facts(Some(bad), None, zone("a")));
        assert_eq!(e.code().number(), 7, "{bad}: {e}");
    }
}

#[test]
fn a_node_no_range_serves_and_a_request_outside_the_choice_are_refused() {
    let only_b = load(
        json!({"type": "hereabouts", "ipRanges": [
            {"range": "198.18.3.0/24", "node_selector": "zone=b"},
            {"range": "2001:db8:3::/64", "node_selector": "zone in (b, c)"},
        ]}),
        ARGS,
    )
    .unwrap();
    assert!(!pools(&only_b).selection.by_pod);
    let e = choose(&only_b, "n1", &facts(Some("ignored: pod_ranges is off"), None, zone("a"))).unwrap_err();
    assert!(e.to_string().contains("no range of network net1 serves node n1: it matches the node_selector of none"));
    let both = choose(&only_b, "n1", &facts(None, None, zone("b"))).unwrap();
    assert_eq!(chosen(&both), ["198.18.3.0/24", "2001:db8:3::/64"]);
    assert_eq!(chosen(&choose(&only_b, "n1", &facts(None, None, zone("c"))).unwrap()), ["2001:db8:3::/64"]);

    let asked = load(
        json!({"type": "hereabouts", "pod_ranges": true, "ipRanges": [
            {"range": "198.18.1.0/24", "name": "blue"}, {"range": "198.18.2.0/24", "name": "red"},
        ]}),
        &format!("{ARGS};IP=198.18.2.7"),
    )
    .unwrap();
    let e = choose(&asked, "n1", &facts(Some("blue"), None, None)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "requested address: 198.18.2.7 lies in no range chosen for pod team-a/web-0 (chosen: blue (198.18.1.0/24))"
    );
    let red = choose(&asked, "n1", &facts(Some("red"), None, None)).unwrap();
    assert_eq!(red.0.requested_for(0), Some("198.18.2.7".parse().unwrap()));
}

#[test]
fn sticky_statefulset_is_per_range_with_a_config_wide_default() {
    let cfg = load(
        json!({"type": "hereabouts", "sticky_statefulset": true, "range": "198.18.1.0/24", "ipRanges": [
            {"range": "198.18.2.0/24"}, {"range": "198.18.3.0/24", "sticky_statefulset": false},
        ]}),
        ARGS,
    )
    .unwrap();
    assert_eq!(pools(&cfg).selection.sticky, [true, true, false]);
    assert!(pools(&cfg).selection.reads_pod() && pools(&cfg).selection.is_active(), "the ADD reads the pod's owner");
    // the owner comes from the ADD's read, never from the config
    let (owned, mut sticky) =
        choose(&cfg, "n1", &RangeFacts { statefulset: Some("web".into()), ..Default::default() }).unwrap();
    assert_eq!(sticky.sticky_statefulset(&owned.ranges, &owned.ranges[0]), Some("web".to_string()));
    assert_eq!(sticky.sticky_statefulset(&owned.ranges, &owned.ranges[2]), None);
    sticky.owner_statefulset = None;
    assert_eq!(sticky.sticky_statefulset(&owned.ranges, &owned.ranges[0]), None, "no owner: nothing recorded");
    let only_entry =
        load(json!({"type": "hereabouts", "ipRanges": [{"range": "198.18.2.0/24", "sticky_statefulset": true}]}), ARGS)
            .unwrap();
    assert_eq!(pools(&only_entry).selection.sticky, [true]);
    let provider = json!({"url": "https://127.0.0.1:1", "ca_file": "/ca.pem", "parent_interface": "eth0"});
    let err = load(
        json!({"type": "hereabouts", "sticky_statefulset": true, "range": "198.18.1.0/24", "iaas_provider": provider}),
        ARGS,
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("ipam.sticky_statefulset: not with ipam.iaas_provider"), "{err}");
    let sliced =
        json!({"type": "hereabouts", "sticky_statefulset": true, "range": "198.18.0.0/16", "node_slice_size": "/24"});
    let err = load(sliced, ARGS).unwrap_err();
    assert!(err.to_string().starts_with("ipam.sticky_statefulset: not with node_slice_size"), "{err}");
    let err =
        load(json!({"type": "hereabouts", "range": "198.18.1.0/24", "stickyStatefulset": true}), ARGS).unwrap_err();
    assert_eq!(err.code().number(), 2, "{err}");
}
