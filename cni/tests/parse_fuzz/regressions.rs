//! Product bugs the generated run found, each as the smallest input that showed it, kept as regression tests.
//! Each failed on 7ab38dd: the loader accepted a config that ADD then could not serve.

use hereabouts_cni::{CniEnv, dispatch};
use hereabouts_ipam::codes::Code;
use hereabouts_ipam::config::{self, Input};

use super::TestConnector;
use super::config::KUBECONFIG;

const ARGS: &str = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-0";

/// ADD of `ipam` (the inner JSON of the `ipam` object) with `extra` top-level keys, on an empty store: the
/// result's addresses, or the error's code and whether it connected first.
fn add(ipam: &str, extra: &str) -> Result<Vec<String>, (Code, String, u32)> {
    let stdin = format!(
        r#"{{"cniVersion": "1.0.0", "name": "net", {extra} "ipam": {{"type": "hereabouts",
            "kubernetes": {{"kubeconfig": "{KUBECONFIG}"}}, {ipam}}}}}"#
    );
    let env = [("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0"), ("CNI_ARGS", ARGS)];
    let env = CniEnv::from_lookup(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_string())).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let host = TestConnector::new();
    match rt.block_on(dispatch(&env, stdin.as_bytes(), &host, |_, _| {})) {
        Ok(out) => {
            let json: serde_json::Value = serde_json::from_str(&out.unwrap_or_default()).unwrap();
            Ok(json["ips"].as_array().unwrap().iter().map(|ip| ip["address"].as_str().unwrap().to_string()).collect())
        }
        Err(e) => Err((e.code, e.details, host.connects.get())),
    }
}

/// Whether the strict loader accepts `ipam` as [`add`] wraps it.
fn accepted(ipam: &str, extra: &str) -> bool {
    let stdin = format!(
        r#"{{"cniVersion": "1.0.0", "name": "net", {extra} "ipam": {{"type": "hereabouts",
            "kubernetes": {{"kubeconfig": "{KUBECONFIG}"}}, {ipam}}}}}"#
    );
    config::load(&Input { stdin: stdin.as_bytes(), cni_args: ARGS }).is_ok()
}

/// A config is either refused before anything is done (code 7, no connect), or its ADD hands out an address.
/// The loader took an address at an offset past i64::MAX for usable, which ADD never hands out
/// (`allocator::MAX_OFFSET`): the ADD connected and failed with 101 "not assignable". Now refused up front.
#[test]
fn requested_address_beyond_max_offset() {
    let ipam = r#""range": "2001:db8::/64""#;
    let extra = r#""runtimeConfig": {"ips": ["2001:db8::8000:0:0:0"]},"#;
    let out = add(ipam, extra);
    let refused_up_front = matches!(&out, Err((Code::InvalidConfig, _, 0)));
    assert!(
        out.as_ref().is_ok_and(|ips| ips == &["2001:db8::8000:0:0:0/64"]) || refused_up_front,
        "loader accepts: {}; ADD: {out:?}",
        accepted(ipam, extra)
    );
}

/// The same for a range whose every usable address lies past i64::MAX: the loader accepted it, and every ADD
/// connected and failed with 100 "exhausted" although the pool was empty. Now refused up front.
#[test]
fn range_beyond_max_offset() {
    let ipam = r#""range": "2001:db8::8000:0:0:0-2001:db8::ffff:ffff:ffff:fffe/64""#;
    let out = add(ipam, "");
    let refused_up_front = matches!(&out, Err((Code::InvalidConfig, _, 0)));
    assert!(out.is_ok() || refused_up_front, "loader accepts: {}; ADD: {out:?}", accepted(ipam, ""));
}

/// Two ranges of one CIDR share a pool, where an attachment holds one entry: the second range handed out the
/// first one's address, which the second range's `exclude` leaves out. Now refused up front.
#[test]
fn ranges_of_one_cidr() {
    let ipam = r#""ipRanges": [{"range": "198.18.0.0/24"},
                               {"range": "198.18.0.0/24", "exclude": ["198.18.0.0/25"]}]"#;
    let out = add(ipam, "");
    let refused_up_front = matches!(&out, Err((Code::InvalidConfig, _, 0)));
    let second_in_its_range = out.as_ref().is_ok_and(|ips| {
        ips.get(1)
            .and_then(|a| a.split('/').next()?.parse::<std::net::Ipv4Addr>().ok())
            .is_some_and(|ip| ip.octets()[3] >= 128)
    });
    assert!(second_in_its_range || refused_up_front, "loader accepts: {}; ADD: {out:?}", accepted(ipam, ""));
}

/// A requested address is accepted when it is usable in one of the ranges that contain it, but ADD asked every
/// range that contains it for it: here the /24's `range_start` leaves it out, and ADD failed with 101 "not
/// assignable" although the /20 could hand it out. Now the first range that can hand it out gives it.
#[test]
fn requested_address_unusable_in_an_overlapping_range() {
    let ipam = r#""ipRanges": [{"range": "198.18.48.0/24", "range_start": "198.18.48.100"},
                               {"range": "198.18.48.0/20"}]"#;
    let extra = r#""runtimeConfig": {"ips": ["198.18.48.2"]},"#;
    let out = add(ipam, extra);
    let refused_up_front = matches!(&out, Err((Code::InvalidConfig, _, 0)));
    assert!(out.is_ok() || refused_up_front, "loader accepts: {}; ADD: {out:?}", accepted(ipam, extra));
}
