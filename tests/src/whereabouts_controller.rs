//! Whereabouts' node-slice controller (`cmd/nodeslicecontroller` of Whereabouts v0.9.2, built by
//! `hack/testenv.sh`), run as a process against a test control plane: what hereabouts must live beside, or refuse
//! to be hurt by, in the slice-ownership tests. It needs the NetworkAttachmentDefinition CRD, which
//! [`WhereaboutsController::start`] installs.

use std::process::{Child, Command, Stdio};

use anyhow::Context as _;

use crate::{Identity, TestCluster, runtime, testenv};

/// The running controller; killed on drop.
#[derive(Debug)]
pub struct WhereaboutsController {
    child: Option<Child>,
    log: std::path::PathBuf,
}

impl WhereaboutsController {
    /// Starts the controller with admin rights, keeping its NodeSlicePools in `namespace`.
    pub async fn start(cluster: &TestCluster, namespace: &str) -> anyhow::Result<Self> {
        let crd = runtime::nad_crd_path().context(
            "the NetworkAttachmentDefinition CRD is missing from the testenv: run `make testenv` to build it",
        )?;
        runtime::install_nad_crd(&cluster.admin().await, &crd).await?;
        let kubeconfig = cluster.kubeconfig(Identity::Admin, namespace);
        let log = cluster.dir().join(format!("whereabouts-nodeslicecontroller-{namespace}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(testenv::tool("whereabouts-nodeslicecontroller"))
            .arg("-kubeconfig")
            .arg(&kubeconfig)
            .env("WHEREABOUTS_NAMESPACE", namespace)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("start whereabouts-nodeslicecontroller")?;
        Ok(Self { child: Some(child), log })
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for WhereaboutsController {
    fn drop(&mut self) {
        self.stop();
    }
}
