//! The Helm chart in `deploy/chart` is the one source of the deployment: `helm lint` passes, its default render is
//! `deploy/daemonset.yaml` byte for byte, each value (namespace, image, host network, metrics address, cron,
//! grace, the CNI's value-gated rights, the node policy's actions, the pod's scheduling, resources and logs) lands
//! where the objects use it, every object carries Helm's standard labels, the CRDs come only with `crds.install`, and
//! the values schema refuses keys the chart does not have. helm is built
//! from its Go module by `hack/testenv.sh`.

use std::path::PathBuf;
use std::process::Command;

use hereabouts_tests::{Identity, TestCluster, deploy, testenv};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use serde_json::Value;

fn chart() -> PathBuf {
    testenv::repo_root().join("deploy/chart")
}

fn helm(args: &[&str]) -> String {
    helm_with(args, &[])
}

fn helm_with(args: &[&str], env: &[(&str, &std::path::Path)]) -> String {
    let out = Command::new(testenv::tool("helm"))
        .args(args)
        .envs(env.iter().copied())
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("hereabouts-helm-cache"))
        .env("HELM_CONFIG_HOME", std::env::temp_dir().join("hereabouts-helm-config"))
        .env("HELM_DATA_HOME", std::env::temp_dir().join("hereabouts-helm-data"))
        .output()
        .expect("run helm");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "helm {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// `helm template` of the chart with `set` values.
fn render(set: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "hereabouts", chart.to_str().unwrap()];
    for s in set {
        args.extend(["--set-string", s]);
    }
    helm(&args)
}

#[test]
fn the_chart_lints_clean() {
    let out = helm(&["lint", "--strict", chart().to_str().unwrap()]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn the_manifest_is_the_charts_default_render() {
    let have = std::fs::read_to_string(deploy::path()).unwrap();
    assert!(
        have == render(&[]),
        "{} is not the chart's default render: run `make manifest` and commit the result",
        deploy::path().display()
    );
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn each_value_lands_where_the_objects_use_it() {
    let text = render(&[
        "namespace=ipam-system",
        "image.repository=registry.example/hereabouts",
        "image.tag=1.2.3",
        "image.pullPolicy=Always",
        "metrics.host=0.0.0.0",
        "metrics.port=9400",
        "cron=*/5 * * * *",
        "gracePeriodSeconds=120",
        "cni.binDir=/var/lib/cni/bin",
        "cni.confDir=/var/run/multus/cni/net.d",
        "apiServer.host=192.0.2.10",
        "apiServer.port=6443",
        "installAsWhereabouts=true",
        "hostNetwork=true",
    ]);
    let objects = deploy::parse(&text).unwrap();
    assert_eq!(objects.len(), deploy::manifest().len(), "the same objects as the manifest");
    for o in &objects {
        let kind = o["kind"].as_str().unwrap();
        if !kind.starts_with("Cluster") && !kind.starts_with("ValidatingAdmissionPolicy") {
            assert_eq!(o["metadata"]["namespace"], "ipam-system", "{kind} {}", o["metadata"]["name"]);
        }
    }
    for binding in objects.iter().filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding") {
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["namespace"], "ipam-system", "{binding}");
        }
    }
    // the policies know the CNI's token and account by the namespace they live in
    let policy = |name: &str| {
        let found = objects.iter().find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == name);
        found.unwrap_or_else(|| panic!("no policy {name}"))["spec"]["matchConditions"].to_string()
    };
    assert!(policy(deploy::NODE_POLICY_NAME).contains("system:serviceaccount:ipam-system:hereabouts-cni"));
    assert!(policy(deploy::TOKEN_POLICY_NAME).contains("request.namespace == 'ipam-system'"));
    let config = find(&objects, "ConfigMap");
    assert_eq!(config["data"]["cron_expression"], "*/5 * * * *");
    assert_eq!(config["data"]["grace_period_seconds"], "120");

    let pod = &find(&objects, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let controller = &find(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(controller["hostNetwork"], true);
    let containers = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["containers"].as_array().unwrap())
        .chain(controller["containers"].as_array().unwrap());
    for c in containers {
        assert_eq!(c["image"], "registry.example/hereabouts:1.2.3", "{}", c["name"]);
        assert_eq!(c["imagePullPolicy"], "Always", "{}", c["name"]);
        if c["name"] == "agent" {
            // it serves the CNI through the host's kubeconfig, which names apiServer.host (install-cni); its own
            // identity (its reads) reaches the API server as the controller's does, below
            let mounts = c["volumeMounts"].as_array().unwrap();
            assert!(mounts.iter().any(|m| m["mountPath"] == "/var/run/multus/cni/net.d"), "{mounts:?}");
        }
        let env = c["env"].as_array().unwrap();
        let var = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
        assert_eq!(var("KUBERNETES_SERVICE_HOST"), Some(Value::from("192.0.2.10")), "{}", c["name"]);
        assert_eq!(var("KUBERNETES_SERVICE_PORT"), Some(Value::from("6443")), "{}", c["name"]);
    }
    let volume = |name: &str| {
        let volumes = pod["volumes"].as_array().unwrap();
        volumes.iter().find(|v| v["name"] == name).unwrap()["hostPath"]["path"].clone()
    };
    assert_eq!(volume("cni-bin"), "/var/lib/cni/bin");
    assert_eq!(volume("cni-net-dir"), "/var/run/multus/cni/net.d");
    let install: Vec<&str> =
        pod["initContainers"][0]["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let host_conf = install.iter().position(|a| *a == "--host-cni-conf-dir").unwrap();
    assert_eq!(install[host_conf + 1], "/var/run/multus/cni/net.d", "the plugin's files as the host sees them");
    assert!(install.contains(&"--install-as-whereabouts"), "{install:?}");
    let reconciler = &controller["containers"][0];
    let args: Vec<&str> = reconciler["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--listen=0.0.0.0:9400"), "{args:?}");
    assert_eq!(reconciler["ports"][0]["containerPort"], 9400);
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(reconciler[probe]["httpGet"]["host"], "127.0.0.1", "listening everywhere, probed on loopback");
    }
    let agent = pod["containers"].as_array().unwrap().iter().find(|c| c["name"] == "agent").expect("the agent");
    let args: Vec<&str> = agent["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--listen=0.0.0.0:9301"), "the agent's endpoints on the metrics host: {args:?}");
    assert_eq!(agent["livenessProbe"]["httpGet"]["host"], "127.0.0.1");
}

/// `helm` with `args`, expected to fail: what it said.
fn helm_refused(args: &[&str]) -> String {
    let out = Command::new(testenv::tool("helm")).args(args).output().expect("run helm");
    assert!(!out.status.success(), "helm {args:?} succeeded:\n{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The schema refuses what the chart would silently drop: a Whereabouts chart's values file (its `cniConf.binDir`
/// would leave the plugin in the default directory on k3s), an unknown key one level down, the old one-string
/// `image`, a log format that is not one; each refusal names the key.
#[test]
fn the_values_schema_refuses_unknown_keys_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let whereabouts = dir.path().join("whereabouts-values.yaml");
    // the keys of Whereabouts' chart (deployment/whereabouts-chart/values.yaml, v0.9.2)
    std::fs::write(
        &whereabouts,
        "image:\n  repository: ghcr.io/k8snetworkplumbingwg/whereabouts\n  pullPolicy: IfNotPresent\n  tag: v0.9.2\n\
         cniConf:\n  confDir: /etc/cni/net.d\n  binDir: /var/lib/rancher/k3s/data/current/bin\n\
         successfulJobsHistoryLimit: 0\n",
    )
    .unwrap();
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let said = helm_refused(&["template", "x", chart, "-f", whereabouts.to_str().unwrap()]);
    assert!(said.contains("cniConf") && said.contains("not allowed"), "{said}");
    assert!(said.contains("successfulJobsHistoryLimit"), "{said}");
    for (set, key) in [
        ("cni.bindir=/opt/cni/bin", "bindir"),
        ("image=hereabouts:0.1.0", "image"),
        ("logFormat=yaml", "logFormat"),
        ("image.digest=latest", "digest"),
    ] {
        let said = helm_refused(&["template", "x", chart, "--set-string", set]);
        assert!(said.contains(key), "{set}: {said}");
    }
}

/// The pod-level values a DaemonSet chart is expected to have land in the pod: the image by digest, pull secrets,
/// node selection, annotations, each container's resources, the log level and format; defaults keep the pod on
/// every Linux node whatever its taints.
#[test]
fn the_pod_values_land_in_the_pod() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let text = render(&[
        &format!("image.digest={digest}"),
        "imagePullSecrets[0].name=regcred",
        "nodeSelector.example\\.com/secondary=yes",
        "tolerations[0].key=example.com/dedicated",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=example.com/zone",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "podAnnotations.example\\.com/team=net",
        "resources.agent.limits.memory=256Mi",
        "logLevel=debug",
        "logFormat=json",
        "extraArgs.agent[0]=--concurrency=7",
        "extraEnv[0].name=HTTPS_PROXY",
        "extraEnv[0].value=http://198.18.0.1:3128",
        "cni.logLevel=debug",
        "cni.logFile=/var/log/hereabouts-cni.log",
    ]);
    let objects = deploy::parse(&text).unwrap();
    let pod = &find(&objects, "DaemonSet")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(spec["nodeSelector"]["example.com/secondary"], "yes", "{}", spec["nodeSelector"]);
    assert_eq!(spec["tolerations"][0]["key"], "example.com/dedicated");
    let term = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(term["nodeSelectorTerms"][0]["matchExpressions"][0]["key"], "example.com/zone");
    assert_eq!(pod["metadata"]["annotations"]["example.com/team"], "net");
    // the controller: the same image, secrets, annotations, logs and environment; its own node selection
    let controller = &find(&objects, "Deployment")["spec"]["template"];
    assert_eq!(controller["spec"]["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(controller["metadata"]["annotations"]["example.com/team"], "net");
    assert!(controller["spec"]["nodeSelector"].get("example.com/secondary").is_none(), "the DaemonSet's value");
    assert!(
        controller["spec"]["affinity"]["nodeAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution").is_none()
    );
    let containers: Vec<&Value> = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(spec["containers"].as_array().unwrap())
        .chain(controller["spec"]["containers"].as_array().unwrap())
        .collect();
    assert_eq!(containers.len(), 3, "install-cni, the agent, the controller's reconciler");
    for c in &containers {
        assert_eq!(c["image"], format!("hereabouts@{digest}"), "{}", c["name"]);
        let env = c["env"].as_array().unwrap();
        let var = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
        assert_eq!(var("RUST_LOG"), Some(Value::from("debug")), "{}", c["name"]);
        assert_eq!(var("HEREABOUTS_LOG_FORMAT"), Some(Value::from("json")), "{}", c["name"]);
        let memory = &c["resources"]["limits"]["memory"];
        let expected = match c["name"].as_str() {
            Some("agent") => "256Mi",
            Some("install-cni") => "64Mi",
            _ => "512Mi",
        };
        assert_eq!(*memory, expected, "{}: the agent's as set, the others' defaults", c["name"]);
        assert_eq!(var("HTTPS_PROXY"), Some(Value::from("http://198.18.0.1:3128")), "{}", c["name"]);
        let command: Vec<&str> = c["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let extra = command.iter().filter(|a| **a == "--concurrency=7").count();
        assert_eq!(extra, usize::from(c["name"] == "agent"), "{}: {command:?}", c["name"]);
        if c["name"] == "agent" {
            assert_eq!(command.last(), Some(&"--concurrency=7"), "appended after the chart's flags");
        }
        if c["name"] == "install-cni" {
            // the flat file's log settings (install-cni's flags; its own tests read the file they write)
            assert!(command.contains(&"--log-level=debug"), "{command:?}");
            assert!(command.contains(&"--log-file=/var/log/hereabouts-cni.log"), "{command:?}");
        }
    }
    let default = find(&deploy::parse(&render(&[])).unwrap(), "DaemonSet")["spec"]["template"]["spec"].clone();
    assert_eq!(default["tolerations"], serde_json::json!([{"operator": "Exists"}]));
    assert_eq!(default["nodeSelector"], serde_json::json!({"kubernetes.io/os": "linux"}));
    assert!(default["affinity"].is_null() && default["imagePullSecrets"].is_null());
    assert_eq!(default["initContainers"][0]["image"], "hereabouts:0.1.0", "the tag defaults to appVersion");
    // the controller's defaults: control-plane nodes preferred (their taint tolerated), replicas apart
    let controller = find(&deploy::parse(&render(&[])).unwrap(), "Deployment")["spec"]["template"]["spec"].clone();
    assert_eq!(controller["tolerations"][0]["key"], "node-role.kubernetes.io/control-plane");
    let preferred = &controller["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred[0]["preference"]["matchExpressions"][0]["key"], "node-role.kubernetes.io/control-plane");
    let apart = &controller["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(apart["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        apart["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "hereabouts-controller"
    );
}

/// The monitoring objects come only with their values: a headless Service of the controller's metrics port selecting
/// its pods and one of the agent's selecting the DaemonSet's, a PodMonitor of ports the containers declare, and a
/// PrometheusRule whose alerts are the ones docs/deploying.md shows, with Prometheus' own templates left for
/// Prometheus.
#[test]
fn the_monitoring_objects_come_only_with_their_values() {
    let kinds = ["Service", "PodMonitor", "PrometheusRule"];
    let default = deploy::parse(&render(&[])).unwrap();
    assert!(!default.iter().any(|o| kinds.iter().any(|k| o["kind"] == *k)), "none by default");
    let objects = deploy::parse(&render(&[
        "monitoring.service=true",
        "monitoring.podMonitor=true",
        "monitoring.prometheusRule=true",
        "metrics.port=9400",
    ]))
    .unwrap();
    assert_eq!(objects.len(), deploy::manifest().len() + 4, "only those four added (two Services)");
    let mut declared = Vec::new();
    for (kind, service_name, port) in [
        ("Deployment", "hereabouts-metrics", ("metrics", 9400)),
        ("DaemonSet", "hereabouts-agent-metrics", ("agent-metrics", 9301)),
    ] {
        let pod = &find(&objects, kind)["spec"]["template"];
        let labels = pod["metadata"]["labels"].as_object().unwrap();
        declared.extend(
            pod["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                .map(|p| (p["name"].as_str().unwrap().to_string(), labels.clone())),
        );
        let service = objects
            .iter()
            .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == service_name)
            .unwrap_or_else(|| panic!("no Service {service_name}"));
        assert_eq!(service["spec"]["clusterIP"], "None");
        for (key, value) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(labels.get(key), Some(value), "{service_name} selects the {kind}'s pods");
        }
        let ports: Vec<(String, u64)> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["targetPort"].as_str().unwrap().to_string(), p["port"].as_u64().unwrap()))
            .collect();
        assert_eq!(ports, [(port.0.to_string(), port.1)], "{service_name}");
    }

    let monitor = find(&objects, "PodMonitor");
    let selects = |labels: &serde_json::Map<String, Value>| {
        monitor["spec"]["selector"]["matchExpressions"].as_array().unwrap().iter().all(|e| {
            e["operator"] == "In"
                && labels.get(e["key"].as_str().unwrap()).is_some_and(|v| e["values"].as_array().unwrap().contains(v))
        })
    };
    for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
        let pods = declared.iter().filter(|(name, _)| endpoint["port"] == name.as_str());
        assert!(pods.clone().count() == 1 && pods.clone().all(|(_, l)| selects(l)), "{endpoint} among {declared:?}");
    }
    let rule = find(&objects, "PrometheusRule");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alerts: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(alerts, ["HereaboutsPoolNearlyFull", "HereaboutsAddressHeldTwice", "HereaboutsCrdSchemaDrift"]);
    assert!(rules[0]["annotations"]["summary"].as_str().unwrap().contains("{{ $labels.pool }}"), "{}", rules[0]);
    let documented = std::fs::read_to_string(testenv::repo_root().join("docs/deploying.md")).unwrap();
    for r in rules {
        let expr = r["expr"].as_str().unwrap();
        assert!(documented.contains(expr), "docs/deploying.md shows the alert {}: {expr}", r["alert"]);
    }
}

/// The CNI's cluster-wide rights come only with their values: by default neither ClusterRole is rendered (nor
/// with the values given as the string "false"); each value adds its ClusterRole and binding, nothing else.
#[test]
fn the_cni_cluster_roles_come_only_with_their_values() {
    let named = |objects: &[Value], name: &str| objects.iter().filter(|o| o["metadata"]["name"] == name).count();
    let off = ["cni.rangeChoice=false", "cni.providerEvents=false", "cni.persistentIPs=false"];
    for off in [render(&[]), render(&off)] {
        let objects = deploy::parse(&off).unwrap();
        let names = [deploy::CNI_RANGES_NAME, deploy::CNI_EVENTS_NAME, deploy::CNI_CLAIMS_NAME];
        assert_eq!(names.iter().map(|n| named(&objects, n)).sum::<usize>(), 0);
        assert_eq!(objects.len(), deploy::manifest().len());
    }
    for (value, name) in [
        (deploy::CNI_RANGES_VALUE, deploy::CNI_RANGES_NAME),
        (deploy::CNI_EVENTS_VALUE, deploy::CNI_EVENTS_NAME),
        (deploy::CNI_CLAIMS_VALUE, deploy::CNI_CLAIMS_NAME),
    ] {
        let objects = deploy::parse(&render(&[value])).unwrap();
        assert_eq!(named(&objects, name), 2, "{value}: the ClusterRole {name} and its binding");
        assert_eq!(objects.len(), deploy::manifest().len() + 2, "{value}: only those two added");
    }
}

/// `hostNetwork` (off by default) moves the pod into the host's network and its endpoints to loopback, with the
/// probes following them there; off, they listen on the pod's addresses and the kubelet probes the pod's IP.
#[test]
fn host_network_is_a_value_and_the_endpoints_follow_it() {
    let pod_of = |text: &str, kind: &str| find(&deploy::parse(text).unwrap(), kind)["spec"]["template"]["spec"].clone();
    for (set, host_network, listen, probe_host) in [
        (vec![], false, "0.0.0.0", Value::Null),
        (vec!["hostNetwork=false"], false, "0.0.0.0", Value::Null),
        (vec!["hostNetwork=true"], true, "127.0.0.1", Value::from("127.0.0.1")),
        (vec!["hostNetwork=true", "metrics.host=[::]"], true, "[::]", Value::from("127.0.0.1")),
    ] {
        let text = render(&set);
        // the controller's reconciler and each node's agent, each on its own port
        for (kind, port) in [("Deployment", 9300), ("DaemonSet", 9301)] {
            let pod = pod_of(&text, kind);
            assert_eq!(pod["hostNetwork"], host_network, "{set:?} {kind}");
            let serving = pod["containers"].as_array().unwrap().iter().find(|c| c["livenessProbe"].is_object());
            let serving = serving.unwrap_or_else(|| panic!("{set:?}: a probed container of the {kind}"));
            let listen = format!("--listen={listen}:{port}");
            assert!(serving["command"].as_array().unwrap().iter().any(|a| *a == listen), "{set:?}: {serving}");
            for probe in ["livenessProbe", "readinessProbe"] {
                assert_eq!(serving[probe]["httpGet"]["host"], probe_host, "{set:?} {kind}: {probe}");
            }
        }
    }
}

/// The node policy denies by default; `cni.nodePolicyActions` makes it only warn and audit (an upgrade from
/// unbound tokens). The token policy always denies.
#[test]
fn the_node_policys_actions_are_a_value() {
    let actions = |text: &str, name: &str| {
        let objects = deploy::parse(text).unwrap();
        let binding = objects
            .iter()
            .find(|o| o["kind"] == "ValidatingAdmissionPolicyBinding" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no binding {name}"))
            .clone();
        assert_eq!(binding["spec"]["policyName"], name);
        binding["spec"]["validationActions"].clone()
    };
    let default = render(&[]);
    assert_eq!(actions(&default, deploy::NODE_POLICY_NAME), serde_json::json!(["Deny"]));
    assert_eq!(actions(&default, deploy::TOKEN_POLICY_NAME), serde_json::json!(["Deny"]));
    let chart = chart();
    let audit =
        helm(&["template", "hereabouts", chart.to_str().unwrap(), "--set", "cni.nodePolicyActions={Warn,Audit}"]);
    assert_eq!(actions(&audit, deploy::NODE_POLICY_NAME), serde_json::json!(["Warn", "Audit"]));
    assert_eq!(actions(&audit, deploy::TOKEN_POLICY_NAME), serde_json::json!(["Deny"]));
}

/// `helm install` on the test API server, into a namespace of its own, creates every object of the manifest there
/// (no node runs the DaemonSet's pods here), and `helm uninstall` removes them. On a control plane of this
/// module's own: the release's ClusterRoles come and go, and helm refuses to install over ones another test
/// applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_and_uninstalls_the_objects() {
    let cluster = TestCluster::own(module_path!());
    let ns = cluster.namespace("helm-install").await;
    let kubeconfig = cluster.kubeconfig(Identity::Admin, &ns);
    let env = [("KUBECONFIG", kubeconfig.as_path())];
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let values = format!("namespace={ns}");
    let install = ["install", "hereabouts", chart, "--namespace", &ns, "--set-string", &values, "--wait=false"];
    let out = helm_with(&install, &env);
    assert!(out.contains("STATUS: deployed"), "{out}");

    let admin = cluster.admin().await;
    let ds = Api::<DaemonSet>::namespaced(admin.clone(), &ns).get("hereabouts").await.unwrap();
    assert_eq!(ds.metadata.annotations.unwrap_or_default()["meta.helm.sh/release-name"], "hereabouts");
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(admin.clone(), &ns);
    assert!(deployments.get_opt(deploy::CONTROLLER_NAME).await.unwrap().is_some(), "the controller");
    assert!(Api::<Lease>::namespaced(admin.clone(), &ns).get_opt("hereabouts-reconciler").await.unwrap().is_some());
    assert!(Api::<ClusterRole>::all(admin.clone()).get_opt("hereabouts").await.unwrap().is_some());
    let policies = Api::<ValidatingAdmissionPolicy>::all(admin.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone());
    for name in [deploy::NODE_POLICY_NAME, deploy::TOKEN_POLICY_NAME] {
        assert!(policies.get_opt(name).await.unwrap().is_some() && bindings.get_opt(name).await.unwrap().is_some());
    }

    helm_with(&["uninstall", "hereabouts", "--namespace", &ns, "--wait"], &env);
    assert!(Api::<DaemonSet>::namespaced(admin.clone(), &ns).get_opt("hereabouts").await.unwrap().is_none());
    assert!(deployments.get_opt(deploy::CONTROLLER_NAME).await.unwrap().is_none(), "the controller goes too");
    assert!(Api::<ClusterRole>::all(admin).get_opt("hereabouts").await.unwrap().is_none());
    for name in [deploy::NODE_POLICY_NAME, deploy::TOKEN_POLICY_NAME] {
        assert!(policies.get_opt(name).await.unwrap().is_none() && bindings.get_opt(name).await.unwrap().is_none());
    }
}

/// `iaasProvider.secretName` mounts that Secret into the reconciler and gives it the provider file; without it
/// (the default, so the manifest) neither is there.
#[test]
fn the_provider_secret_turns_on_the_reconcilers_provider_release() {
    let reconciler_of = |text: &str| {
        let objects = deploy::parse(text).unwrap();
        let pod = find(&objects, "Deployment")["spec"]["template"]["spec"].clone();
        (pod["containers"][0].clone(), pod["volumes"].clone())
    };
    let flag = "--iaas-provider-config=/etc/hereabouts-iaas/iaas_provider.json";
    let (reconciler, volumes) = reconciler_of(&render(&["iaasProvider.secretName=cloud-provider"]));
    let args: Vec<&str> = reconciler["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&flag), "{args:?}");
    let mounts = reconciler["volumeMounts"].as_array().unwrap();
    let mount = mounts.iter().find(|m| m["name"] == "iaas-provider").unwrap_or_else(|| panic!("{mounts:?}"));
    assert_eq!(mount["mountPath"], "/etc/hereabouts-iaas");
    assert_eq!(mount["readOnly"], true);
    let volume = volumes.as_array().unwrap().iter().find(|v| v["name"] == "iaas-provider").unwrap();
    assert_eq!(volume["secret"]["secretName"], "cloud-provider");

    let (reconciler, volumes) = reconciler_of(&render(&[]));
    assert!(!reconciler["command"].to_string().contains("iaas"), "off by default");
    assert!(!volumes.to_string().contains("iaas-provider"), "off by default");
}

/// Every object carries Helm's standard labels, while what the DaemonSet selects, and its pod template's labels,
/// stay the one label they were: a selector cannot change on upgrade, and a new chart version alone must not roll
/// every node's pod.
#[test]
fn every_object_has_helms_standard_labels_and_the_selector_stays_put() {
    let objects = deploy::parse(&render(&[
        "monitoring.service=true",
        "monitoring.podMonitor=true",
        "monitoring.prometheusRule=true",
        "crds.install=true",
        "cni.rangeChoice=true",
        "cni.providerEvents=true",
        "cni.persistentIPs=true",
    ]))
    .unwrap();
    for o in &objects {
        let labels = &o["metadata"]["labels"];
        let what = format!("{} {}", o["kind"], o["metadata"]["name"]);
        assert_eq!(labels["app.kubernetes.io/name"], "hereabouts", "{what}");
        assert_eq!(labels["app.kubernetes.io/instance"], "hereabouts", "{what}: the release's name");
        assert_eq!(labels["app.kubernetes.io/version"], "0.1.0", "{what}");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{what}");
        assert_eq!(labels["helm.sh/chart"], "hereabouts-0.1.0", "{what}");
    }
    let only_name = serde_json::json!({"app.kubernetes.io/name": "hereabouts"});
    let ds = find(&objects, "DaemonSet");
    assert_eq!(ds["spec"]["selector"]["matchLabels"], only_name);
    assert_eq!(ds["spec"]["template"]["metadata"]["labels"], only_name);
    let controller = serde_json::json!({"app.kubernetes.io/name": "hereabouts-controller"});
    let deployment = find(&objects, "Deployment");
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], controller);
    assert_eq!(deployment["spec"]["template"]["metadata"]["labels"], controller);
    let service = |name: &str| {
        let found = objects.iter().find(|o| o["kind"] == "Service" && o["metadata"]["name"] == name);
        found.unwrap_or_else(|| panic!("no Service {name}"))["spec"]["selector"].clone()
    };
    assert_eq!(service("hereabouts-metrics"), controller);
    assert_eq!(service("hereabouts-agent-metrics"), only_name);
    let monitor = find(&objects, "PodMonitor");
    let values = &monitor["spec"]["selector"]["matchExpressions"][0]["values"];
    assert_eq!(*values, serde_json::json!(["hereabouts-controller", "hereabouts"]), "both kinds of pod");
}

/// `crds.install` puts the three CRDs of `crds/` in the release, as they are there plus the release's labels, and
/// each kept on uninstall; without it the release holds none.
#[test]
fn the_crds_come_with_the_release_only_when_asked_and_are_kept_on_uninstall() {
    let none = deploy::parse(&render(&[])).unwrap();
    assert!(!none.iter().any(|o| o["kind"] == "CustomResourceDefinition"));
    let objects = deploy::parse(&render(&["crds.install=true"])).unwrap();
    let crds: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "CustomResourceDefinition").collect();
    let dir = testenv::repo_root().join("crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert_eq!(crds.len(), files.len(), "one per file of crds/");
    for (crd, file) in crds.iter().zip(&files) {
        let committed = deploy::parse(&std::fs::read_to_string(file).unwrap()).unwrap().remove(0);
        assert_eq!(crd["metadata"]["name"], committed["metadata"]["name"], "{}", file.display());
        assert_eq!(crd["spec"], committed["spec"], "{}: the same schema", file.display());
        assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    }
}

/// `fullnameOverride` renames every object and every reference to one — the bindings' subjects and roles, the
/// pod's ServiceAccount and ConfigMap, the token the install-cni container mints and the Role that lets it, the
/// admission policies' service-account match and their bindings, the Lease and the flag that names it — and
/// `nameOverride` the name label the selectors use; by default neither changes the render.
#[test]
fn the_name_overrides_rename_every_object_and_every_reference_to_it() {
    let objects = deploy::parse(&render(&[
        "fullnameOverride=ipam",
        "nameOverride=ipam-app",
        "cni.rangeChoice=true",
        "cni.providerEvents=true",
        "cni.persistentIPs=true",
        "monitoring.service=true",
        "monitoring.podMonitor=true",
        "monitoring.prometheusRule=true",
    ]))
    .unwrap();
    for o in &objects {
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("ipam"), "{} {name}", o["kind"]);
        assert_eq!(o["metadata"]["labels"]["app.kubernetes.io/name"], "ipam-app", "{} {name}", o["kind"]);
    }
    let named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    for o in objects.iter().filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding") {
        let role = o["roleRef"]["name"].as_str().unwrap();
        named(o["roleRef"]["kind"].as_str().unwrap(), role);
        for subject in o["subjects"].as_array().unwrap() {
            named("ServiceAccount", subject["name"].as_str().unwrap());
        }
    }
    let ds = named("DaemonSet", "ipam");
    let pod = &ds["spec"]["template"];
    assert_eq!(ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "ipam-app");
    assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/name"], "ipam-app");
    named("ServiceAccount", pod["spec"]["serviceAccountName"].as_str().unwrap());
    let controller = named("Deployment", "ipam-controller");
    let controller_pod = &controller["spec"]["template"];
    assert_eq!(controller["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "ipam-app-controller");
    assert_eq!(controller_pod["metadata"]["labels"]["app.kubernetes.io/name"], "ipam-app-controller");
    named("ServiceAccount", controller_pod["spec"]["serviceAccountName"].as_str().unwrap());
    let apart =
        &controller_pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        apart[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "ipam-app-controller"
    );
    let volumes = controller_pod["spec"]["volumes"].as_array().unwrap();
    let config = volumes.iter().find(|v| v["name"] == "config").unwrap();
    named("ConfigMap", config["configMap"]["name"].as_str().unwrap());
    let command = |c: &Value| -> Vec<String> {
        c["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
    };
    let install = command(&pod["spec"]["initContainers"][0]);
    let minted = &install[install.iter().position(|a| a == "--cni-service-account").unwrap() + 1];
    assert_eq!(minted, "ipam-cni");
    let node_role = named("Role", "ipam-node");
    let token_rule =
        node_role["rules"].as_array().unwrap().iter().find(|r| r["resources"][0] == "serviceaccounts/token");
    assert_eq!(token_rule.unwrap()["resourceNames"], serde_json::json!(["ipam-cni"]));
    let role = named("Role", "ipam");
    let reconciler =
        controller_pod["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "reconciler").unwrap();
    assert!(command(reconciler).contains(&"--lease-name=ipam-reconciler".to_string()), "{:?}", command(reconciler));
    named("Lease", "ipam-reconciler");
    let lease_rule = role["rules"].as_array().unwrap().iter().find(|r| r["resources"][0] == "leases").unwrap();
    assert_eq!(lease_rule["resourceNames"], serde_json::json!(["ipam-reconciler"]));
    let policy = named("ValidatingAdmissionPolicy", "ipam-cni-node");
    let matched = policy["spec"]["matchConditions"].to_string();
    assert!(matched.contains(":ipam-cni'"), "the policy matches the renamed ServiceAccount: {matched}");
    for binding in objects.iter().filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding") {
        named("ValidatingAdmissionPolicy", binding["spec"]["policyName"].as_str().unwrap());
    }
    let service = named("Service", "ipam-metrics");
    assert_eq!(service["spec"]["selector"]["app.kubernetes.io/name"], "ipam-app-controller");
    let service = named("Service", "ipam-agent-metrics");
    assert_eq!(service["spec"]["selector"]["app.kubernetes.io/name"], "ipam-app");

    let refused = helm_refused(&[
        "template",
        "hereabouts",
        chart().to_str().unwrap(),
        "--set-string",
        "fullnameOverride=Not_A_Name",
    ]);
    assert!(refused.contains("fullnameOverride"), "{refused}");
}
