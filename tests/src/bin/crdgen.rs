//! Writes `crds/*.yaml` from the Rust types (`make crds`).

fn main() -> anyhow::Result<()> {
    let dir = hereabouts_tests::crds::dir();
    std::fs::create_dir_all(&dir)?;
    for (file, yaml) in hereabouts_tests::crds::render() {
        let path = dir.join(file);
        std::fs::write(&path, yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
