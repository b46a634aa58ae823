//! The image written without a daemon is a well-formed OCI layout of the static binaries: every digest and size
//! names what is there, the index carries the name containerd imports it under, and the layer holds the very
//! binaries built, executable and static.

use std::collections::BTreeMap;

use hereabouts_tests::containerd::Containerd;
use hereabouts_tests::image::{self, BIN_DIR, BINARIES};
use hereabouts_tests::{elf, plugin};
use serde_json::Value;

fn sha256(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    format!("sha256:{}", d.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn blob<'a>(entries: &'a BTreeMap<String, (u32, Vec<u8>)>, descriptor: &Value) -> &'a [u8] {
    let digest = descriptor["digest"].as_str().expect("a digest");
    let (_, bytes) = entries
        .get(&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")))
        .unwrap_or_else(|| panic!("no blob for {digest}"));
    assert_eq!(sha256(bytes), digest, "the blob's content has its digest");
    assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64), "the descriptor's size of {digest}");
    bytes
}

fn entries_of(tar: &std::path::Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    image::read_tar(tar).unwrap().into_iter().map(|(name, mode, body)| (name, (mode, body))).collect()
}

#[test]
fn the_layout_names_what_it_holds_and_holds_the_static_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hereabouts.tar");
    let bins = plugin::target_dir();
    let written = image::write(&out, "hereabouts:0.1.0-test", &bins).unwrap();
    assert_eq!(written.name, "docker.io/library/hereabouts:0.1.0-test");

    let layout = entries_of(&out);
    assert_eq!(layout["oci-layout"].1, br#"{"imageLayoutVersion":"1.0.0"}"#);
    let index: Value = serde_json::from_slice(&layout["index.json"].1).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(entry["annotations"]["io.containerd.image.name"], "docker.io/library/hereabouts:0.1.0-test");
    assert_eq!(entry["digest"], written.manifest_digest.as_str());

    let manifest: Value = serde_json::from_slice(blob(&layout, entry)).unwrap();
    let config: Value = serde_json::from_slice(blob(&layout, &manifest["config"])).unwrap();
    let layer_bytes = blob(&layout, &manifest["layers"][0]);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
    assert_eq!(config["rootfs"]["diff_ids"][0], sha256(layer_bytes), "uncompressed: the diff id is the digest");
    assert_eq!(config["config"]["Entrypoint"][0], format!("/{BIN_DIR}/hereabouts-reconciler"));
    assert_eq!(config["architecture"], "amd64");

    let layer_path = dir.path().join("layer.tar");
    std::fs::write(&layer_path, layer_bytes).unwrap();
    let layer = entries_of(&layer_path);
    for binary in BINARIES {
        let (mode, bytes) = &layer[&format!("{BIN_DIR}/{binary}")];
        assert_eq!(*mode, 0o755, "{binary} is executable");
        assert!(bytes == &std::fs::read(bins.join(binary)).unwrap(), "{binary} is the binary built");
        let linkage = elf::linkage(bytes).unwrap();
        assert_eq!(linkage, elf::Linkage { interpreter: None, needed: vec![] }, "{binary} in the image is static");
    }
    assert!(String::from_utf8_lossy(&layer["etc/passwd"].1).contains(":65532:"), "nonroot is named");
}

#[test]
fn the_same_binaries_give_the_same_digest() {
    let dir = tempfile::tempdir().unwrap();
    let bins = plugin::target_dir();
    let a = image::write(&dir.path().join("a.tar"), "hereabouts:1", &bins).unwrap();
    let b = image::write(&dir.path().join("b.tar"), "hereabouts:1", &bins).unwrap();
    assert_eq!(a.manifest_digest, b.manifest_digest);
}

/// containerd imports the layout as it is and runs the image's static binaries with runc.
#[test]
fn containerd_imports_it_and_runs_its_binaries() {
    let runtime = Containerd::start();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("hereabouts.tar");
    let written = image::write(&tar, "hereabouts:0.1.0-ctr", &plugin::target_dir()).unwrap();
    let said = |out: &std::process::Output| {
        format!("{}{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr), runtime.log())
    };
    let import = runtime.ctr(&["images", "import", tar.to_str().unwrap()]);
    assert!(import.status.success(), "import: {}", said(&import));
    let listed = runtime.ctr(&["images", "ls", "-q"]);
    assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|l| l == written.name), "{}", said(&listed));

    let run =
        runtime.ctr(&["run", "--rm", &written.name, "version", "/usr/local/bin/hereabouts-reconciler", "--version"]);
    assert!(run.status.success(), "run: {}", said(&run));
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        concat!("hereabouts-reconciler ", env!("CARGO_PKG_VERSION"))
    );
}
