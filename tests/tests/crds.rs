//! The committed `crds/*.yaml` must be what the Rust types generate.

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
