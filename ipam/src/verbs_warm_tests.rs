//! The verbs on a node whose agent keeps a warm reserve ([`crate::warm`]): what an ADD, served by the agent or by
//! the binary while the agent is away, does with the takes the agent's journal holds pending.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::store::MemoryStore;
use crate::store::memory::{Fault, FaultPlan, Op};
use crate::warm::Reserves;

const NS: &str = "kube-system";
const NODE: &str = "node-a";

/// The node: the store its API server answers with, its attachment marks and boot, and its agent's journal.
#[derive(Clone)]
struct Node {
    store: MemoryStore,
    marks: PathBuf,
    boot: String,
    journal: PathBuf,
}

/// An invocation the node agent serves, with its reserves.
struct Agent(Node, Reserves<MemoryStore>);

/// An invocation the binary serves alone: it reads the agent's journal, never writes it.
struct Binary(Node);

impl Node {
    fn open_reserves(&self) -> Reserves<MemoryStore> {
        Reserves::open(NODE, &self.journal, Arc::new(|_| Box::pin(async { Ok(()) })))
    }
}

/// What both kinds of invocation have of the node (`self.0`): its store, marks and boot; no routing table or host
/// lock.
macro_rules! the_node {
    () => {
        type Store = MemoryStore;
        type Table = KernelTable;

        async fn connect(&self, _kubeconfig: &Path) -> Result<MemoryStore, ConnectError> {
            Ok(self.0.store.clone())
        }

        fn table(&self) -> Result<KernelTable, TableError> {
            Err(TableError::Netlink { op: "open a netlink socket", detail: "not in these tests".into() })
        }

        fn lock_dir(&self) -> Option<PathBuf> {
            None
        }

        fn marks_dir(&self) -> Option<PathBuf> {
            Some(self.0.marks.clone())
        }

        fn boot_id(&self) -> Option<String> {
            Some(self.0.boot.clone())
        }
    };
}

impl Host for Agent {
    the_node!();

    async fn take_warm(
        &self,
        cfg: &IpamConfig,
        mode: &crate::config::Slices,
        req: &Request,
        first: bool,
    ) -> Option<Vec<Assigned>> {
        self.1.take(cfg, mode, req, first, Path::new("/k"), self.0.store.clone())
    }

    async fn settle_warm(&self, network: &str, req: &Request, why: Settling) -> WarmSettled {
        self.1.settle(network, req, why).await
    }

    async fn settle_attachment_warm(
        &self,
        cfg: &IpamConfig,
        _mode: &crate::config::Slices,
        req: &Request,
    ) -> WarmSettled {
        let store = Some(self.0.store.clone());
        self.1.settle_attachment(&cfg.name, &cfg.pod.to_string(), &req.ifname, Path::new("/k"), store).await
    }
}

impl Host for Binary {
    the_node!();

    fn warm_journal(&self, _node: &str) -> Option<PathBuf> {
        Some(self.0.journal.clone())
    }
}

fn config(pod: &str) -> IpamConfig {
    let ipam = serde_json::json!({
        "type": "hereabouts", "range": "198.18.0.0/24", "node_slice_size": "/28", "warm_addresses": 2,
        "enable_overlapping_ranges": true, "kubernetes": {"kubeconfig": "/k"},
    });
    let stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": ipam}).to_string();
    let args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod};K8S_POD_UID={pod}-uid");
    crate::config::load_with_paths(&crate::config::Input { stdin: stdin.as_bytes(), cni_args: &args }, &[]).unwrap()
}

fn request(container: &str) -> Request {
    Request { container_id: container.into(), ifname: "net1".into(), node: NODE.into() }
}

/// The API server refusing every reservation read: no hand-over can begin.
fn away(store: &MemoryStore) -> MemoryStore {
    store.handle("away", (1..=10_000).fold(FaultPlan::quiet(7), |p, n| p.at(Op::GetReservation, n, Fault::TooMany)))
}

/// The entries of pod `pod`, as `(address, container)`.
fn entries_of(store: &MemoryStore, pod: &str) -> Vec<(std::net::IpAddr, String)> {
    let podref = format!("ns/{pod}");
    let mut found = Vec::new();
    for pool in store.pools() {
        for (offset, entry) in pool.spec.allocations.iter().filter(|(_, e)| e.podref == podref) {
            let ip = crate::claim::address_of(&pool, offset.parse().unwrap()).unwrap();
            found.push((ip, entry.id.clone()));
        }
    }
    found
}

/// A node whose agent took a warm slot for pod `pw` (sandbox `c1`) and died, rebooting, before handing it over:
/// the take is pending in the journal on disk, the entry still the node's in the API server. Returns the node as
/// it boots again and the address `pw` was answered.
async fn rebooted_with_a_pending_take() -> (Node, tempfile::TempDir, std::net::IpAddr) {
    let disk = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let node = Node {
        store: store.clone(),
        marks: disk.path().join("attachments"),
        boot: "boot-1".into(),
        journal: disk.path().join("warm"),
    };
    let reserves = node.open_reserves();
    reserves.know(Path::new("/k"), store.clone());
    let agent = Agent(node.clone(), reserves.clone());
    add(&agent, &config("p0"), &request("c0")).await.unwrap();
    for _ in 0..600 {
        if reserves.held().get("net") == Some(&2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reserves.held().get("net"), Some(&2), "the reserve filled");
    reserves.know(Path::new("/k"), away(&store));
    let agent = Agent(Node { store: away(&store), ..node.clone() }, reserves.clone());
    let taken = add(&agent, &config("pw"), &request("c1")).await.unwrap()[0].ip;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reserves.pending(), 1, "not handed over while the API server is away");
    assert!(entries_of(&store, "pw").is_empty(), "the entry is still the node's");
    reserves.stop();
    (Node { boot: "boot-2".into(), ..node }, disk, taken)
}

/// Found by the reboot simulation: a pod took a warm address, and its node rebooted before the agent handed it
/// over. The pod's sandbox made again after the reboot is not its first ADD (the marks outlive the boot), no take
/// answers its new container, and the ADD looked for its entry in the API server — still the node's — and claimed
/// a second address, while the restarted agent handed the first one over to the old sandbox. Now the ADD hands
/// the attachment's pending take over first and keeps that address in its new sandbox.
#[tokio::test(start_paused = true)]
async fn a_sandbox_made_again_after_a_reboot_keeps_the_warm_address_its_pod_took_before() {
    let (node, _disk, taken) = rebooted_with_a_pending_take().await;
    // the agent back, before its loop knows the API server: the ADD is what hands the take over
    let reserves = node.open_reserves();
    assert_eq!(reserves.pending(), 1, "the journal kept the take");
    let agent = Agent(node.clone(), reserves.clone());
    let again = add(&agent, &config("pw"), &request("c2")).await.unwrap();
    assert_eq!(again[0].ip, taken, "the pod keeps the address it took before the reboot");
    assert_eq!(entries_of(&node.store, "pw"), vec![(taken, "c2".to_string())], "one entry, the new sandbox's");
    assert_eq!(reserves.pending(), 0, "handed over");
    reserves.stop();
}

/// The same with the agent not yet back: the binary serves the ADD, hands the journal's take over itself, and
/// keeps the address; while the API server is away it fails with "try again later" and claims nothing.
#[tokio::test(start_paused = true)]
async fn the_binary_hands_an_earlier_sandboxs_warm_take_over_before_it_looks_or_claims_nothing() {
    let (node, _disk, taken) = rebooted_with_a_pending_take().await;
    let writes = node.store.writes();
    let binary = Binary(Node { store: away(&node.store), ..node.clone() });
    let refused = add(&binary, &config("pw"), &request("c2")).await.unwrap_err();
    assert_eq!(refused.code, Code::TryAgainLater, "{refused:?}");
    assert!(refused.details.contains("not handed over"), "{}", refused.details);
    assert_eq!(node.store.writes(), writes, "nothing written while the take cannot be handed over");
    let again = add(&Binary(node.clone()), &config("pw"), &request("c2")).await.unwrap();
    assert_eq!(again[0].ip, taken, "the pod keeps the address it took before the reboot");
    assert_eq!(entries_of(&node.store, "pw"), vec![(taken, "c2".to_string())], "one entry, the new sandbox's");
}
