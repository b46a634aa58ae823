//! `kubectl-hereabouts`: the operator's view of hereabouts' allocations, as a kubectl plugin (`kubectl hereabouts
//! ...` once it is on `PATH`). It reads and writes the same objects the CNI plugin and the reconciler do, with
//! the same guarded writes and the same release rule.

mod check;
mod client;
mod lint;
mod migrate;
mod output;
mod release;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory as _, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "kubectl-hereabouts", version, about = "See, check and fix hereabouts' address allocations")]
struct Cli {
    #[command(flatten)]
    kube: KubeFlags,
    #[command(subcommand)]
    command: Command,
}

/// kubectl's connection flags: the same kubeconfig rules (`--kubeconfig`, else `KUBECONFIG`, else
/// `~/.kube/config`, else in-cluster).
#[derive(Args, Debug, Clone)]
struct KubeFlags {
    /// The kubeconfig file.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace of the pools and reservations (default: the namespace hereabouts' DaemonSet runs in, else
    /// kube-system; never the context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Address management: show, check, release.
    Ipam {
        #[command(subcommand)]
        command: IpamCommand,
    },
    /// Loads every hereabouts/whereabouts NetworkAttachmentDefinition (or the files given) with hereabouts' config
    /// rules and lists what it would refuse. Exit status 1 when any is refused.
    Lint(lint::LintArgs),
    /// Prints a shell completion script for `kubectl-hereabouts ...`: `kubectl-hereabouts completion bash >
    /// /etc/bash_completion.d/kubectl-hereabouts` (zsh: as `_kubectl-hereabouts` in a directory of `$fpath`).
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
enum IpamCommand {
    /// Capacity, allocated and free addresses per pool, or who holds one address.
    Show(show::ShowArgs),
    /// Every inconsistency (stale entries, missing or orphaned reservations, addresses held twice, offsets
    /// Whereabouts cannot read, gone nodes' slices); exit status 1 when any. --repair fixes the safe ones.
    Check(check::CheckArgs),
    /// Gives one address back, guarded: refuses a live pod's address unless --force.
    Release(release::ReleaseArgs),
    /// Moves the live entries of pools a changed config replaced (a range grown, shrunk or moved) into the pool
    /// that replaced them, as the leader reconciler does: a dry run unless --apply.
    Migrate(migrate::MigrateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Ipam { command: IpamCommand::Show(args) } => show::run(&cli.kube, &args).await,
            Command::Ipam { command: IpamCommand::Check(args) } => check::run(&cli.kube, &args).await,
            Command::Ipam { command: IpamCommand::Release(args) } => release::run(&cli.kube, &args).await,
            Command::Ipam { command: IpamCommand::Migrate(args) } => migrate::run(&cli.kube, &args).await,
            Command::Lint(args) => lint::run(&cli.kube, &args).await,
            Command::Completion { shell } => {
                clap_complete::generate(shell, &mut Cli::command(), "kubectl-hereabouts", &mut std::io::stdout());
                Ok(true)
            }
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
