//! The binaries are static, so they run on a host whose glibc is older than the builder's, or absent; and the CNI
//! plugin then still reaches an API server its kubeconfig names by host name: with the host's shared libraries
//! (the loader, libc, the NSS modules a static glibc would load to resolve a name) hidden from it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::{Invocation, Output, netconf, workspace_bin};
use hereabouts_tests::{Identity, SERVER_NAME, elf, kubeconfig};
use serde_json::{Value, json};

/// Where Debian (merged /usr) keeps the loader, libc and the NSS modules.
const HOST_LIBRARIES: &str = "/usr/lib/x86_64-linux-gnu";

#[test]
fn both_binaries_need_no_loader_and_no_shared_library() {
    for name in ["hereabouts", "hereabouts-reconciler"] {
        let path = workspace_bin(name);
        let found = elf::linkage(&std::fs::read(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            found,
            elf::Linkage { interpreter: None, needed: Vec::new() },
            "{} is dynamically linked: build it with .cargo/config.toml's static target (no RUSTFLAGS in the \
             environment, which would replace its rustflags)",
            path.display()
        );
    }
}

/// Runs `hereabouts` as the runtime would, but in a mount namespace of its own whose /etc/hosts is `hosts`, whose
/// /etc/resolv.conf is empty (no name server is ever asked) and whose host libraries are an empty directory. Its
/// nsswitch.conf resolves host names through systemd-resolved's NSS module, as some distributions' do: a module
/// only the host's own glibc can load, so a static glibc's `getaddrinfo` finds no name here, and the plugin's
/// own resolver must.
struct Isolated {
    dir: tempfile::TempDir,
}

impl Isolated {
    fn new(hosts: &str) -> Self {
        assert!(
            Path::new(HOST_LIBRARIES).is_dir(),
            "{HOST_LIBRARIES} is missing: this test hides the host's libraries there (a Debian-family x86_64 host)"
        );
        for tool in ["/usr/bin/unshare", "/bin/mount"] {
            assert!(Path::new(tool).is_file(), "{tool} is missing: install util-linux and mount");
        }
        for target in ["/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf"] {
            assert!(Path::new(target).is_file(), "{target} is missing: a bind mount needs a file to cover");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hosts"), hosts).unwrap();
        std::fs::write(dir.path().join("resolv.conf"), "").unwrap();
        std::fs::write(dir.path().join("nsswitch.conf"), "hosts: resolve [!UNAVAIL=return] dns\n").unwrap();
        // The mounts come before the libraries vanish: mount itself is dynamically linked. The plugin is exec'd
        // by the shell, already loaded.
        let script = format!(
            "#!/bin/sh\nexec /usr/bin/unshare --mount --propagation private /bin/sh -c '\
             /bin/mount --bind \"$ISOLATED/hosts\" /etc/hosts && \
             /bin/mount --bind \"$ISOLATED/resolv.conf\" /etc/resolv.conf && \
             /bin/mount --bind \"$ISOLATED/nsswitch.conf\" /etc/nsswitch.conf && \
             /bin/mount -t tmpfs hidden {HOST_LIBRARIES} && exec \"$PLUGIN\"'\n"
        );
        let wrapper = dir.path().join("isolated");
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    async fn run(&self, fx: &CniFixture, command: &'static str, config: &Value, pod: &str) -> Output {
        let mut invocation = Invocation::new(command, config, &fx.ns, pod, &format!("{pod}-sandbox"))
            .with_env("ISOLATED", &self.dir.path().display().to_string())
            .with_env("PLUGIN", &workspace_bin("hereabouts").display().to_string());
        invocation.program = Some(self.dir.path().join("isolated"));
        invocation.run().await
    }
}

/// A kubeconfig of the CNI identity in `fx`'s namespace whose server is `host` at the API server's port.
fn kubeconfig_naming(fx: &CniFixture, host: &str) -> PathBuf {
    let port = fx.cluster.server().rsplit(':').next().expect("the server URL has a port");
    let path = fx.cluster.dir().join(format!("kubeconfig-{host}-{}", fx.ns));
    let text = kubeconfig::render(
        &format!("https://{host}:{port}"),
        fx.cluster.ca_pem(),
        Identity::Cni.user(),
        fx.cluster.token(Identity::Cni),
        &fx.ns,
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_del_reach_a_server_named_in_the_hosts_file_with_the_host_libraries_hidden() {
    let fx = CniFixture::new("static-named").await;
    let isolated = Isolated::new(&format!("127.0.0.1 {SERVER_NAME}\n"));
    let config = netconf("1.0.0", "static", &kubeconfig_naming(&fx, SERVER_NAME), json!({"range": "198.18.94.0/28"}));

    let added = isolated.run(&fx, "ADD", &config, "named").await;
    assert_eq!(added.ips(), vec!["198.18.94.1".parse::<std::net::IpAddr>().unwrap()], "{}", added.stderr);
    let pool = fx.pool("198.18.94.0-28").await;
    assert_eq!(pool.spec.allocations.len(), 1, "{:?}", pool.spec.allocations);

    let deleted = isolated.run(&fx, "DEL", &config, "named").await;
    assert!(deleted.success, "{}\n{}", deleted.stdout, deleted.stderr);
    assert!(fx.pool("198.18.94.0-28").await.spec.allocations.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_nothing_resolves_is_try_again_later_naming_it_and_writes_nothing() {
    let fx = CniFixture::new("static-unnamed").await;
    let isolated = Isolated::new(&format!("127.0.0.1 {SERVER_NAME}\n"));
    let host = "apiserver.hereabouts.invalid";
    let config = netconf("1.0.0", "static", &kubeconfig_naming(&fx, host), json!({"range": "198.18.94.16/28"}));

    let added = isolated.run(&fx, "ADD", &config, "unnamed").await;
    assert_eq!(added.error_code(), 11, "{}", added.stderr);
    assert!(added.stdout.contains(host), "the error names the host: {}", added.stdout);
    assert_eq!(fx.object_count().await, (0, 0), "nothing is written");
}
