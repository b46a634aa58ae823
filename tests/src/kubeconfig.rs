//! Kubeconfig files for the test control plane, one identity each, as a CNI plugin or a controller reads them.

use base64::Engine as _;
use serde_json::json;

/// A kubeconfig (YAML is a superset of JSON; this writes JSON) for `server`, trusting `ca_pem`, authenticating
/// with `token`, whose current context uses `namespace`.
pub fn render(server: &str, ca_pem: &str, user: &str, token: &str, namespace: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hereabouts-test", "cluster": {
            "server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {
            "cluster": "hereabouts-test", "user": user, "namespace": namespace}}],
        "current-context": user,
    });
    serde_json::to_string_pretty(&doc).expect("a kubeconfig serialises")
}
