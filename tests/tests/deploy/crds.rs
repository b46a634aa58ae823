//! The CRDs: the committed `crds/*.yaml` must be what the Rust types generate, and `kubectl get` shows their
//! printer columns.

#[test]
fn committed_crds_match_the_types() {
    let dir = hereabouts_tests::crds::dir();
    for (file, want) in hereabouts_tests::crds::render() {
        let path = dir.join(file);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(have == want, "{} is stale or missing: run `make crds` and commit the result", path.display());
    }
    let committed = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "yaml")));
    assert_eq!(committed.count(), hereabouts_tests::crds::render().len(), "crds/ holds a manifest no type generates");
}

/// `kubectl get` shows the printer columns: the API server's Table view of what an ADD wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_range_network_podref_interface_and_node() {
    use hereabouts_tests::fixture::CniFixture;
    use serde_json::{Value, json};

    let fx = CniFixture::new("crd-columns").await;
    let config = fx.netconf("1.0.0", "columns", json!({"range": "198.18.96.0/28", "network_name": "blue"}));
    let add = fx.invocation("ADD", &config, "web", "c-web").with_env("NODENAME", "node-cols").run().await;
    assert_eq!(add.ips().len(), 1, "{}", add.stderr);

    let table = |plural: &'static str| {
        let admin = fx.admin.clone();
        let path = format!("/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{}/{plural}", fx.ns);
        async move {
            let req = http::Request::get(path)
                .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
                .body(Vec::new())
                .unwrap();
            let table: Value = serde_json::from_str(&admin.request_text(req).await.unwrap()).unwrap();
            let names: Vec<String> = table["columnDefinitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect();
            let rows: Vec<Vec<Value>> =
                table["rows"].as_array().unwrap().iter().map(|r| r["cells"].as_array().unwrap().clone()).collect();
            (names, rows)
        }
    };
    let (columns, rows) = table("ippools").await;
    assert_eq!(columns, ["Name", "Range", "Network", "Allocated", "Usable", "Age"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][1..3], [json!("198.18.96.0/28"), json!("blue")]);
    // the usable count is the creating ADD's; the allocated count is the leader reconciler's, not running here
    assert_eq!(rows[0][4], json!("14"), "{:?}", rows[0]);

    let (columns, rows) = table("overlappingrangeipreservations").await;
    assert_eq!(columns, ["Name", "PodRef", "Interface", "Node", "Age"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][1..4], [json!(format!("{}/web", fx.ns)), json!("net1"), json!("node-cols")]);
}

/// `kubectl get hereabouts` lists every kind hereabouts stores: the API server's discovery puts the three in the
/// category, and `kubectl explain` has a description of each (not the derive's placeholder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_kinds_are_in_the_hereabouts_category_and_explained() {
    use serde_json::Value;
    let admin = hereabouts_tests::TestCluster::get().admin().await;
    let req = http::Request::get("/apis/whereabouts.cni.cncf.io/v1alpha1").body(Vec::new()).unwrap();
    let discovery: Value = serde_json::from_str(&admin.request_text(req).await.unwrap()).unwrap();
    let mut in_category: Vec<&str> = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["categories"].as_array().is_some_and(|c| c.iter().any(|c| c == "hereabouts")))
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    in_category.sort();
    assert_eq!(in_category, ["ippools", "nodeslicepools", "overlappingrangeipreservations"], "{discovery}");
    for (file, text) in hereabouts_tests::crds::render() {
        let crd: Value = serde_yaml_ng::from_str(&text).unwrap();
        let description = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"].as_str().unwrap();
        assert!(!description.starts_with("Auto-generated") && description.len() > 80, "{file}: {description}");
    }
}
