//! Nodes and laptops behind a proxy: the runtime hands the plugin its own environment, `HTTPS_PROXY` among it, and
//! the CNI binary, the agent and `kubectl hereabouts` reach the API server through the proxy (a `CONNECT` tunnel),
//! past it where `NO_PROXY` covers the server, and say so when the setting cannot be used.
//!
//! The kubeconfigs name the server `apiserver.hereabouts.test` (in the serving certificate), a name only the proxy
//! resolves: a client that reached the server by it went through the proxy.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use hereabouts_tests::agent::Agent;
use hereabouts_tests::connect_proxy::ConnectProxy;
use hereabouts_tests::ctl::ctl_with_env;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::{Invocation, Output, netconf, workspace_bin};
use hereabouts_tests::{Identity, SERVER_NAME, kubeconfig};
use serde_json::{Value, json};

/// A kubeconfig of `id` in `fx`'s namespace whose server is `SERVER_NAME` at the API server's port.
fn kubeconfig_by_name(fx: &CniFixture, id: Identity) -> PathBuf {
    let port = fx.cluster.server().rsplit(':').next().expect("the server URL has a port");
    let path = fx.cluster.dir().join(format!("kubeconfig-proxied-{id:?}-{}", fx.ns));
    let text = kubeconfig::render(
        &format!("https://{SERVER_NAME}:{port}"),
        fx.cluster.ca_pem(),
        id.user(),
        fx.cluster.token(id),
        &fx.ns,
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn config_by_name(fx: &CniFixture, range: &str) -> Value {
    netconf("1.1.0", "proxied", &kubeconfig_by_name(fx, Identity::Cni), json!({ "range": range }))
}

/// The `CONNECT` targets that name the test API server.
fn tunnels_to_server(proxy: &ConnectProxy) -> usize {
    proxy.connects().iter().filter(|t| t.starts_with(&format!("{SERVER_NAME}:"))).count()
}

#[tokio::test]
async fn the_binary_reaches_the_server_through_the_proxy_and_its_name_is_the_proxys_to_resolve() {
    let fx = CniFixture::new("proxy-cni").await;
    let proxy = ConnectProxy::start(&[SERVER_NAME]).await;
    let config = config_by_name(&fx, "198.18.126.0/29");

    // without the proxy the name resolves nowhere: the kubeconfig can only work through it
    let direct = fx.invocation("ADD", &config, "p0", "c0").run().await;
    assert_eq!(direct.error_code(), 11, "{}", direct.stdout);
    assert!(direct.stdout.contains(SERVER_NAME), "{}", direct.stdout);

    for var in ["HTTPS_PROXY", "https_proxy"] {
        let pod = format!("p-{}", var.to_lowercase());
        let add = fx.invocation("ADD", &config, &pod, &pod).with_env(var, &proxy.url()).run().await;
        assert!(add.success, "{var}: {}\n{}", add.stdout, add.stderr);
        assert_eq!(add.ips().len(), 1, "{}", add.stdout);
        let check = fx.invocation("CHECK", &config, &pod, &pod).with_env(var, &proxy.url()).run().await;
        assert!(check.success, "{var}: {}", check.stdout);
        let del = fx.invocation("DEL", &config, &pod, &pod).with_env(var, &proxy.url()).run().await;
        assert!(del.success, "{var}: {}", del.stdout);
    }
    assert!(tunnels_to_server(&proxy) >= 6, "every call tunnelled: {:?}", proxy.connects());
    assert!(fx.pool("198.18.126.0-29").await.spec.allocations.is_empty(), "both DELs gave the address back");
}

#[tokio::test]
async fn kubectl_hereabouts_and_the_agent_reach_the_server_through_the_proxy() {
    let fx = CniFixture::new("proxy-agent").await;
    let proxy = ConnectProxy::start(&[SERVER_NAME]).await;
    let config = config_by_name(&fx, "198.18.126.8/29");

    // the agent has the proxy in its environment; the binary that hands it the ADD does not, so the binary could
    // not have done the work itself: the name resolves nowhere without the proxy
    let socket = fx.cluster.dir().join(format!("{}-proxy.sock", fx.ns));
    let proxy_url = proxy.url();
    let agent = Agent::start_with(&socket, "node-a", &[("HTTPS_PROXY", Path::new(&proxy_url))]).await;
    let add = fx
        .invocation("ADD", &config, "via-agent", "via-agent")
        .with_env("NODENAME", "node-a")
        .with_env("HEREABOUTS_AGENT_SOCKET", socket.to_str().unwrap())
        .run()
        .await;
    assert!(add.success, "{}\n{}\n--- agent ---\n{}", add.stdout, add.stderr, agent.logs());
    assert!(agent.logs().contains("served"), "the agent served it: {}", agent.logs());
    assert!(tunnels_to_server(&proxy) >= 1, "{:?}", proxy.connects());

    // kubectl hereabouts on a laptop behind the proxy, with the admin's kubeconfig naming the server
    let before = tunnels_to_server(&proxy);
    let admin = kubeconfig_by_name(&fx, Identity::Admin);
    let env = [("HTTPS_PROXY", proxy_url.as_str())];
    let ip = add.ips()[0].to_string();
    let shown = ctl_with_env(&admin, &["-n", &fx.ns, "ipam", "show", "--ip", &ip], &env).await;
    assert!(shown.success, "{}\n{}", shown.stdout, shown.stderr);
    assert!(shown.stdout.contains("via-agent"), "the agent's allocation {ip} is shown: {}", shown.stdout);
    assert!(tunnels_to_server(&proxy) > before, "{:?}", proxy.connects());
    // and without the proxy it cannot: the name is the proxy's
    let alone = ctl_with_env(&admin, &["-n", &fx.ns, "ipam", "show"], &[]).await;
    assert!(!alone.success && alone.stderr.contains(SERVER_NAME), "{}", alone.stderr);
}

/// Runs the plugin in a mount namespace of its own whose /etc/hosts names the API server: a client there reaches
/// the server directly, without a proxy, by the same name.
struct NamedHost {
    dir: tempfile::TempDir,
}

impl NamedHost {
    fn new() -> Self {
        for tool in ["/usr/bin/unshare", "/bin/mount"] {
            assert!(Path::new(tool).is_file(), "{tool} is missing: install util-linux and mount");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hosts"), format!("127.0.0.1 {SERVER_NAME}\n")).unwrap();
        let script = "#!/bin/sh\nexec /usr/bin/unshare --mount --propagation private /bin/sh -c '\
                      /bin/mount --bind \"$HOSTS_FILE\" /etc/hosts && exec \"$PLUGIN\"'\n";
        let wrapper = dir.path().join("named");
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    async fn run(&self, invocation: Invocation) -> Output {
        let mut invocation = invocation
            .with_env("HOSTS_FILE", &self.dir.path().join("hosts").display().to_string())
            .with_env("PLUGIN", &workspace_bin("hereabouts").display().to_string());
        invocation.program = Some(self.dir.path().join("named"));
        invocation.run().await
    }
}

#[tokio::test]
async fn no_proxy_covering_the_server_bypasses_the_proxy() {
    let fx = CniFixture::new("proxy-bypass").await;
    let proxy = ConnectProxy::start(&[SERVER_NAME]).await;
    let config = config_by_name(&fx, "198.18.126.16/28");
    let named = NamedHost::new();

    // the same host, the proxy set and nothing to bypass it: tunnelled (so the next step can fail)
    let through = named.run(fx.invocation("ADD", &config, "p1", "c1").with_env("HTTPS_PROXY", &proxy.url())).await;
    assert!(through.success, "{}", through.stdout);
    assert_eq!(tunnels_to_server(&proxy), 1, "{:?}", proxy.connects());

    let mut pods = 1;
    for no_proxy in [".hereabouts.test", "hereabouts.test", "foo.test, apiserver.hereabouts.test"] {
        for var in ["NO_PROXY", "no_proxy"] {
            pods += 1;
            let pod = format!("p{pods}");
            let inv = fx.invocation("ADD", &config, &pod, &pod).with_env("HTTPS_PROXY", &proxy.url());
            let add = named.run(inv.with_env(var, no_proxy)).await;
            assert!(add.success, "{var}={no_proxy}: {}", add.stdout);
        }
    }
    assert_eq!(tunnels_to_server(&proxy), 1, "NO_PROXY bypassed the proxy: {:?}", proxy.connects());
}

#[tokio::test]
async fn an_unusable_proxy_setting_is_reported_as_such_and_writes_nothing() {
    let fx = CniFixture::new("proxy-bad").await;
    let config = config_by_name(&fx, "198.18.126.32/29");

    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, &str, &str); 4] = [
        (&[("HTTPS_PROXY", "ftp://user:secret@proxy.test:21")], "HTTPS_PROXY", "scheme \"ftp\""),
        (&[("https_proxy", "http://user:secret@bad host:1")], "https_proxy", "not a proxy URL"),
        (&[("HTTPS_PROXY", "socks4://proxy.test:1080")], "HTTPS_PROXY", "scheme \"socks4\""),
        // kube reads NO_PROXY itself, and refuses an empty entry where Go's clients skip it
        (&[("HTTPS_PROXY", "http://127.0.0.1:9"), ("NO_PROXY", "a.test,,b.test")], "NO_PROXY", "value is empty"),
    ];
    for (env, var, says) in cases {
        let mut add = fx.invocation("ADD", &config, "p1", "c1");
        for (k, v) in env {
            add = add.with_env(k, v);
        }
        let add = add.run().await;
        assert_eq!(add.error_code(), 4, "{env:?}: {}", add.stdout);
        let details = add.json()["details"].as_str().unwrap_or_default().to_string();
        assert!(details.contains(var) && details.contains(says), "{env:?}: {details}");
        assert!(!add.stdout.contains("secret"), "the password is not printed: {}", add.stdout);
    }
    // a proxy that does not answer: the API server cannot be reached for now, as with any unreachable server
    // (a short budget: the plugin retries until it ends)
    let mut short = config.clone();
    short["ipam"]["timeout_seconds"] = json!(5);
    let refused = fx.invocation("ADD", &short, "p1", "c1").with_env("HTTPS_PROXY", "http://127.0.0.1:9").run().await;
    assert_eq!(refused.error_code(), 11, "{}", refused.stdout);
    assert_eq!(fx.object_count().await, (0, 0), "nothing is written");
}
