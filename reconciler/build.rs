//! Names the commit the binary is built from (`hereabouts_build_info`, the first log line): `HEREABOUTS_REVISION`
//! when the build passes one (an image built from a tree without `.git`), else `git rev-parse`, else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HEREABOUTS_REVISION");
    let given = std::env::var("HEREABOUTS_REVISION").ok().filter(|r| !r.trim().is_empty());
    let revision = given.or_else(git_revision).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HEREABOUTS_REVISION={revision}");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn git_revision() -> Option<String> {
    // built again when HEAD moves to another branch or its branch to another commit
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    {
        println!("cargo:rerun-if-changed={path}");
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}
