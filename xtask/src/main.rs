//! `xtask`: the release chores of the workspace.
//!
//! - `xtask crds` writes `crds/*.yaml` from the Rust types (`make crds`).
//! - `xtask image OUT [REFERENCE] [BIN_DIR]` writes the hereabouts image as an OCI layout tar from built binaries,
//!   with no container daemon (`make image`; defaults: `hereabouts:0.1.0`, the directory of this executable).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "Release chores: the CRD manifests and the image")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes crds/*.yaml from the Rust types in hereabouts_ipam::crd.
    Crds,
    /// Writes the image as an OCI layout tar from built binaries, with no container daemon.
    Image {
        /// The tar to write.
        out: PathBuf,
        /// The image reference (`name:tag`).
        #[arg(default_value = "hereabouts:0.1.0")]
        reference: String,
        /// Where `hereabouts` and `hereabouts-reconciler` are; the directory of this executable by default (build
        /// them with the same profile).
        bin_dir: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds => {
            let dir = hereabouts_xtask::crds::dir();
            std::fs::create_dir_all(&dir)?;
            for (file, yaml) in hereabouts_xtask::crds::render() {
                let path = dir.join(file);
                std::fs::write(&path, yaml)?;
                println!("wrote {}", path.display());
            }
        }
        Command::Image { out, reference, bin_dir } => {
            let bin_dir = match bin_dir {
                Some(dir) => dir,
                None => std::env::current_exe()?.parent().expect("the executable's directory").to_path_buf(),
            };
            let written = hereabouts_xtask::image::write(&out, &reference, &bin_dir)?;
            println!(
                "{}: {} ({}), layer {} bytes, layout tar {} bytes",
                out.display(),
                written.name,
                written.manifest_digest,
                written.layer_size,
                written.tar_size
            );
        }
    }
    Ok(())
}
