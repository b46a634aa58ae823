//! Running `kubectl-hereabouts`, the compiled operator CLI, as an operator would.

use std::path::Path;

use crate::plugin::workspace_bin;

/// What one run of the CLI printed, and whether it exited 0.
#[derive(Debug, Clone)]
pub struct Ran {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `kubectl-hereabouts --kubeconfig <kubeconfig> -n <namespace> <args>`, with no `KUBECONFIG` from the environment.
pub async fn ctl(kubeconfig: &Path, namespace: &str, args: &[&str]) -> Ran {
    let with_namespace: Vec<&str> = ["-n", namespace].into_iter().chain(args.iter().copied()).collect();
    ctl_as_is(kubeconfig, &with_namespace).await
}

/// `kubectl-hereabouts --kubeconfig <kubeconfig> <args>`: the namespace as the CLI chooses it without `-n`.
pub async fn ctl_as_is(kubeconfig: &Path, args: &[&str]) -> Ran {
    ctl_with_env(kubeconfig, args, &[]).await
}

/// [`ctl_as_is`] with more environment (a proxy's variables, say).
pub async fn ctl_with_env(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let out = tokio::process::Command::new(workspace_bin("kubectl-hereabouts"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run kubectl-hereabouts");
    Ran {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
