//! Writes the hereabouts image as an OCI layout tar from built binaries, with no container daemon:
//! `image OUT [REFERENCE] [BIN_DIR]` (defaults: `hereabouts:0.1.0`, the directory of this executable).

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let out = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage: image OUT [REFERENCE] [BIN_DIR]"))?);
    let reference = args.next().map_or_else(|| "hereabouts:0.1.0".to_string(), |r| r.to_string_lossy().into_owned());
    let bin_dir = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()?.parent().expect("the executable's directory").to_path_buf(),
    };
    let written = hereabouts_tests::image::write(&out, &reference, &bin_dir)?;
    println!(
        "{}: {} ({}), layer {} bytes, layout tar {} bytes",
        out.display(),
        written.name,
        written.manifest_digest,
        written.layer_size,
        written.tar_size
    );
    Ok(())
}
