//! `CNI_ARGS` and the rest of the environment: what runtimes and Multus pass, and what they get wrong.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::{Index, select};

use super::config::{Netconf, re};

/// `IP=` in CNI_ARGS.
#[derive(Debug, Clone)]
enum IpArg {
    None,
    /// The address `runtimeConfig.ips` asks for, again (a repeat is allowed).
    Repeat,
    /// Another usable address (valid only when the config requests none).
    Fresh,
    /// An address outside every range (code 7).
    Outside,
    /// Not an address list (code 4).
    Junk(&'static str),
}

/// `GATEWAY=` in CNI_ARGS.
#[derive(Debug, Clone)]
enum GatewayArg {
    None,
    /// Inside the first static address (valid only with static addresses).
    Static,
    /// Inside none of them (code 4).
    Outside,
    Junk,
}

/// A pair that breaks the rules of `cnitypes.LoadArgs`, or an unknown one.
#[derive(Debug, Clone, Copy)]
enum Extra {
    NoEquals,
    TwoEquals,
    Empty,
    /// Let through only with `IgnoreUnknown` true.
    Unknown,
    /// `k8s_pod_name`: unknown too, keys are case-sensitive.
    CaseVariant,
    RepeatSame,
    RepeatConflict,
}

/// The draws for `CNI_ARGS`.
#[derive(Debug, Clone)]
pub struct ArgsPlan {
    present: bool,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    infra: bool,
    ignore_unknown: Option<&'static str>,
    ip: IpArg,
    gateway: GatewayArg,
    extras: Vec<Extra>,
    rotate: Index,
}

/// Pod names and namespaces: mostly Kubernetes names, sometimes empty or any text without `;` and `=`.
fn pod_value() -> impl Strategy<Value = String> {
    prop_oneof![
        24 => re("[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?"),
        1 => Just(String::new()),
        2 => re("[^;=]{1,8}"),
    ]
}

pub fn args_plan() -> impl Strategy<Value = ArgsPlan> {
    let ip = prop_oneof![
        14 => Just(IpArg::None),
        3 => Just(IpArg::Repeat),
        3 => Just(IpArg::Fresh),
        1 => Just(IpArg::Outside),
        1 => select(&["198.18.0.300", "198.18.0.1,", ",", "abc", "198.18.0.1/33", " "][..]).prop_map(IpArg::Junk),
    ];
    let gateway = prop_oneof![
        16 => Just(GatewayArg::None),
        3 => Just(GatewayArg::Static),
        1 => Just(GatewayArg::Outside),
        1 => Just(GatewayArg::Junk),
    ];
    let extra = prop_oneof![
        Just(Extra::NoEquals),
        Just(Extra::TwoEquals),
        Just(Extra::Empty),
        Just(Extra::Unknown),
        Just(Extra::CaseVariant),
        Just(Extra::RepeatSame),
        Just(Extra::RepeatConflict),
    ];
    let extras = prop_oneof![12 => Just(Vec::new()), 1 => prop::collection::vec(extra, 1..3)];
    let ignore = prop_oneof![
        9 => select(&["1", "true", "True", "0", "false"][..]),
        1 => select(&["yes", "", "2", "TRUE "][..]),
    ];
    (
        (
            prop::bool::weighted(0.97),
            prop::option::weighted(0.97, pod_value()),
            prop::option::weighted(0.97, pod_value()),
        ),
        (prop::option::weighted(0.5, re("[0-9a-f-]{36}")), any::<bool>(), prop::option::weighted(0.6, ignore)),
        (ip, gateway, extras, any::<Index>()),
    )
        .prop_map(|((present, namespace, name), (uid, infra, ignore_unknown), (ip, gateway, extras, rotate))| {
            ArgsPlan { present, namespace, name, uid, infra, ignore_unknown, ip, gateway, extras, rotate }
        })
}

/// `CNI_ARGS` as rendered for one config, and whether the strict reading accepts it by construction.
#[derive(Debug, Clone)]
pub struct Args {
    pub text: Option<String>,
    pub valid: bool,
}

impl ArgsPlan {
    pub fn render(&self, conf: &Netconf) -> Args {
        if !self.present {
            return Args { text: None, valid: true };
        }
        let mut valid = true;
        let mut pairs: Vec<String> = Vec::new();
        let mut pair = |k: &str, v: &str| pairs.push(format!("{k}={v}"));
        if let Some(ns) = &self.namespace {
            pair("K8S_POD_NAMESPACE", ns);
        }
        if let Some(name) = &self.name {
            pair("K8S_POD_NAME", name);
        }
        if let Some(uid) = &self.uid {
            pair("K8S_POD_UID", uid);
        }
        if self.infra {
            pair("K8S_POD_INFRA_CONTAINER_ID", "c0");
        }
        let ignore_unknown = match self.ignore_unknown {
            Some(v) => {
                pair("IgnoreUnknown", v);
                valid &= ["1", "true", "True", "0", "false"].contains(&v);
                ["1", "true", "True"].contains(&v)
            }
            None => false,
        };
        match &self.ip {
            IpArg::None => {}
            IpArg::Repeat => {
                if let Some(ip) = conf.requested {
                    pair("IP", &ip.to_string());
                }
            }
            IpArg::Fresh => {
                if let Some(ip) = conf.free {
                    pair("IP", &ip.to_string());
                    valid &= conf.requested.is_none();
                }
            }
            IpArg::Outside => {
                pair("IP", "203.0.113.9");
                valid = false;
            }
            IpArg::Junk(s) => {
                pair("IP", s);
                valid = false;
            }
        }
        match self.gateway {
            GatewayArg::None => {}
            GatewayArg::Static => {
                if let Some(gw) = conf.static_gateway {
                    pair("GATEWAY", &gw.to_string());
                }
            }
            GatewayArg::Outside => {
                pair("GATEWAY", "203.0.113.1");
                valid = false;
            }
            GatewayArg::Junk => {
                pair("GATEWAY", "gw");
                valid = false;
            }
        }
        for extra in &self.extras {
            match extra {
                Extra::NoEquals => pairs.push("K8S_POD_NAME".into()),
                Extra::TwoEquals => pairs.push("A=b=c".into()),
                Extra::Empty => pairs.push(String::new()),
                Extra::Unknown => pairs.push("FOO=bar".into()),
                Extra::CaseVariant => pairs.push("k8s_pod_name=x".into()),
                Extra::RepeatSame => pairs.push("K8S_POD_INFRA_CONTAINER_ID=c0".into()),
                Extra::RepeatConflict => {
                    pairs.push("K8S_POD_INFRA_CONTAINER_ID=c1".into());
                    pairs.push("K8S_POD_INFRA_CONTAINER_ID=c2".into());
                }
            }
            valid &= match extra {
                Extra::NoEquals | Extra::TwoEquals | Extra::Empty | Extra::RepeatConflict => false,
                Extra::Unknown | Extra::CaseVariant => ignore_unknown,
                // a repeat of c0 conflicts with nothing unless c1/c2 are there, which are invalid anyway
                Extra::RepeatSame => true,
            };
        }
        if !pairs.is_empty() {
            let k = self.rotate.index(pairs.len());
            pairs.rotate_left(k);
        }
        Args { text: Some(pairs.join(";")), valid }
    }
}

/// An environment variable: set, set to `""`, or unset.
#[derive(Debug, Clone)]
enum Var {
    Set(String),
    Empty,
    Missing,
}

fn var(value: impl Strategy<Value = String>) -> impl Strategy<Value = Var> {
    prop_oneof![60 => value.prop_map(Var::Set), 1 => Just(Var::Empty), 1 => Just(Var::Missing)]
}

/// The draws for the environment.
#[derive(Debug, Clone)]
pub struct EnvPlan {
    command: Var,
    container_id: Var,
    ifname: Var,
    nodename: Var,
    netns: bool,
}

pub fn env_plan() -> impl Strategy<Value = EnvPlan> {
    let command = prop_oneof![
        30 => Just("ADD".to_string()),
        15 => Just("DEL".to_string()),
        12 => Just("CHECK".to_string()),
        12 => Just("GC".to_string()),
        8 => Just("STATUS".to_string()),
        5 => Just("VERSION".to_string()),
        3 => select(&["add", "Add", "DELETE", "VERSION ", " ADD", "\u{0}", "GET"][..]).prop_map(String::from),
        1 => re("\\PC{1,6}"),
    ];
    (
        var(command),
        var(re("[0-9a-f]{8,64}")),
        var(prop_oneof![4 => Just("eth0".to_string()), 1 => Just("net1".to_string()), 1 => re("[a-z0-9]{1,15}")]),
        prop_oneof![3 => Just(Var::Set("node-1".into())), 1 => Just(Var::Empty), 1 => Just(Var::Missing)],
        any::<bool>(),
    )
        .prop_map(|(command, container_id, ifname, nodename, netns)| EnvPlan {
            command,
            container_id,
            ifname,
            nodename,
            netns,
        })
}

impl EnvPlan {
    /// The environment, with `CNI_ARGS` from `args`.
    pub fn render(&self, args: &Args) -> BTreeMap<&'static str, String> {
        let mut env = BTreeMap::new();
        for (name, v) in [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_IFNAME", &self.ifname),
            ("NODENAME", &self.nodename),
        ] {
            match v {
                Var::Set(s) => {
                    env.insert(name, s.clone());
                }
                Var::Empty => {
                    env.insert(name, String::new());
                }
                Var::Missing => {}
            }
        }
        if let Some(text) = &args.text {
            env.insert("CNI_ARGS", text.clone());
        }
        if self.netns {
            env.insert("CNI_NETNS", "/var/run/netns/cni-fuzz".into());
            env.insert("CNI_PATH", "/opt/cni/bin".into());
        }
        env
    }
}

/// Whether `env` is what `CniEnv::from_lookup` must accept: a known verb, and for ADD, DEL and CHECK a
/// container id and an interface.
pub fn env_is_valid(env: &BTreeMap<&'static str, String>) -> bool {
    let get = |k: &str| env.get(k).map_or("", String::as_str);
    match get("CNI_COMMAND") {
        "ADD" | "DEL" | "CHECK" => !get("CNI_CONTAINERID").is_empty() && !get("CNI_IFNAME").is_empty(),
        "GC" | "STATUS" | "VERSION" => true,
        _ => false,
    }
}
