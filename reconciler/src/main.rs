//! `hereabouts-reconciler`: the DaemonSet binary. `run` (the default) gives back what deleted and finished pods
//! held, runs the cron-scheduled cluster reconcile and, with `--agent-socket`, the node agent; `install-cni` puts
//! the CNI plugin and its kubeconfig on the host; `agent` runs the node agent alone.

use clap::{Parser, Subcommand};
use hereabouts_reconciler::{agent, install_cni, run};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(name = "hereabouts-reconciler", version, about)]
struct Cli {
    /// How log lines are written to stderr: `text` (key=value) or `json` (one object per line, for log shippers).
    #[arg(long, global = true, env = "HEREABOUTS_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Give back what deleted and finished pods held, and run the cron-scheduled cluster reconcile.
    Run(run::Args),
    /// Copy the CNI binary to the host and write its kubeconfig and flat file, then keep the kubeconfig fresh.
    InstallCni(install_cni::Args),
    /// Serve the CNI binary's invocations on a unix socket, and nothing else.
    Agent(agent::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // RUST_LOG's directives (`debug`, `hereabouts_reconciler=debug,kube=info`), else info; a value that does not
    // parse is said and passed over rather than keeping the DaemonSet from starting.
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives).unwrap_or_else(|e| {
            eprintln!("hereabouts-reconciler: RUST_LOG={directives:?} does not parse ({e}); logging at info");
            EnvFilter::new("info")
        }),
        _ => EnvFilter::new("info"),
    };
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let command = match &cli.command {
        Command::Run(_) => "run",
        Command::InstallCni(_) => "install-cni",
        Command::Agent(_) => "agent",
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        revision = hereabouts_reconciler::REVISION,
        command,
        "hereabouts-reconciler starting"
    );
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match cli.command {
        Command::Run(args) => rt.block_on(run::run(args)),
        Command::InstallCni(args) => rt.block_on(install_cni::run(args)),
        Command::Agent(args) => rt.block_on(agent::run(args)),
    }
}
