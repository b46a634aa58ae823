//! The hereabouts image written without a container daemon: one uncompressed layer holding the static binaries
//! (and a passwd naming `nonroot`), its config and manifest, and an OCI image layout around them, in one tar —
//! what `make image` writes (`xtask image`) and `ctr images import` loads on the test node. The `Dockerfile`
//! builds the same file system for Docker and BuildKit users. Deterministic: every time stamp is 0 and every
//! owner root, so the same binaries give the same digests.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use ring::digest::{Context, SHA256};
use serde_json::json;

/// Where the binaries live in the image (on the image's `PATH`).
pub const BIN_DIR: &str = "usr/local/bin";

/// The binaries an image of this project holds.
pub const BINARIES: [&str; 2] = ["hereabouts", "hereabouts-reconciler"];

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The image's name as containerd records it, e.g. `docker.io/library/hereabouts:0.1.0`.
    pub name: String,
    /// `sha256:<hex>` of the manifest: the image's digest.
    pub manifest_digest: String,
    /// Bytes of the one layer, uncompressed.
    pub layer_size: u64,
    /// Bytes of the whole layout tar.
    pub tar_size: u64,
}

/// Writes the image `reference` (`name:tag`; a name without a registry is Docker Hub's library, as a pod spec's
/// `image: hereabouts:0.1.0` means it) holding the binaries found in `bin_dir`, as an OCI layout tar at `out`.
pub fn write(out: &Path, reference: &str, bin_dir: &Path) -> io::Result<Written> {
    let files = BINARIES.iter().map(|b| (format!("{BIN_DIR}/{b}"), bin_dir.join(b))).collect();
    let entrypoint = vec![format!("/{BIN_DIR}/hereabouts-reconciler")];
    write_image(out, reference, &Contents { files, entrypoint, cmd: vec!["run".into()], title: "hereabouts" })
}

/// Writes a pod sandbox image (the role of Kubernetes' `pause`) holding the static program `pause` as `/pause`.
pub fn write_pause(out: &Path, reference: &str, pause: &Path) -> io::Result<Written> {
    let files = vec![("pause".to_string(), pause.to_path_buf())];
    write_image(out, reference, &Contents { files, entrypoint: vec!["/pause".into()], cmd: vec![], title: "pause" })
}

/// What an image holds: executables (path in the image, file on this machine) besides `etc/passwd`, and how it
/// starts.
struct Contents<'a> {
    files: Vec<(String, PathBuf)>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    title: &'a str,
}

fn write_image(out: &Path, reference: &str, contents: &Contents<'_>) -> io::Result<Written> {
    let name = containerd_name(reference);
    let tag = reference.rsplit_once(':').map_or("latest", |(_, t)| t);
    let work = tempfile::tempdir_in(out.parent().unwrap_or(Path::new(".")))?;

    // The layer goes to a file first: its digest and size must be known before the layout tar names it.
    let layer_path = work.path().join("layer.tar");
    let mut layer = Tar::new(HashingWriter::new(BufWriter::new(File::create(&layer_path)?)));
    let mut dirs: Vec<&str> = vec!["etc"];
    for (inside, _) in &contents.files {
        let mut parent = Path::new(inside.as_str()).parent();
        while let Some(dir) = parent.and_then(Path::to_str).filter(|d| !d.is_empty()) {
            dirs.push(dir);
            parent = Path::new(dir).parent();
        }
    }
    dirs.sort_unstable();
    dirs.dedup();
    for dir in dirs {
        layer.dir(dir)?;
    }
    layer.file("etc/passwd", 0o644, &mut &PASSWD.as_bytes()[..], PASSWD.len() as u64)?;
    for (inside, path) in &contents.files {
        let mut source = File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let len = source.metadata()?.len();
        layer.file(inside, 0o755, &mut source, len)?;
    }
    let (layer_digest, layer_size) = layer.finish()?.finish()?;

    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [format!("PATH=/{BIN_DIR}:/usr/bin:/bin")],
            "Entrypoint": &contents.entrypoint,
            "Cmd": &contents.cmd,
            "Labels": {"org.opencontainers.image.title": contents.title},
        },
        "rootfs": {"type": "layers", "diff_ids": [&layer_digest]},
        "history": [{"created_by": "hereabouts-tests image (OCI layout, no daemon)"}],
    }))?;
    let config_digest = digest(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": &config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": &layer_digest, "size": layer_size}],
    }))?;
    let manifest_digest = digest(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": &manifest_digest,
            "size": manifest.len(),
            "annotations": {"io.containerd.image.name": &name, "org.opencontainers.image.ref.name": tag},
        }],
    }))?;

    let mut tar = Tar::new(BufWriter::new(File::create(out)?));
    tar.bytes("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    tar.bytes("index.json", &index)?;
    tar.dir("blobs")?;
    tar.dir("blobs/sha256")?;
    tar.bytes(&blob(&config_digest), &config)?;
    tar.bytes(&blob(&manifest_digest), &manifest)?;
    tar.file(&blob(&layer_digest), 0o644, &mut File::open(&layer_path)?, layer_size)?;
    tar.finish()?.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(Written { name, manifest_digest, layer_size, tar_size: std::fs::metadata(out)?.len() })
}

/// How containerd names an image a pod spec calls `reference`.
pub fn containerd_name(reference: &str) -> String {
    let first = reference.split('/').next().unwrap_or_default();
    let has_registry = reference.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, reference.contains('/')) {
        (true, _) => reference.to_string(),
        (false, true) => format!("docker.io/{reference}"),
        (false, false) => format!("docker.io/library/{reference}"),
    }
}

/// root, and distroless' nonroot (65532), which the DaemonSet's reconciler container runs as.
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";

fn blob(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(ring::digest::digest(&SHA256, bytes).as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that counts and hashes what passes through it.
struct HashingWriter<W> {
    inner: W,
    hash: Context,
    len: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self { inner, hash: Context::new(&SHA256), len: 0 }
    }

    /// Flushes; the digest and the length.
    fn finish(mut self) -> io::Result<(String, u64)> {
        self.inner.flush()?;
        Ok((format!("sha256:{}", hex(self.hash.finish().as_ref())), self.len))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A ustar archive writer: regular files and directories, names under 100 bytes, owner root, time 0.
struct Tar<W> {
    out: W,
}

impl<W: Write> Tar<W> {
    fn new(out: W) -> Self {
        Self { out }
    }

    fn dir(&mut self, path: &str) -> io::Result<()> {
        self.header(&format!("{path}/"), 0o755, 0, b'5')
    }

    fn bytes(&mut self, path: &str, bytes: &[u8]) -> io::Result<()> {
        self.file(path, 0o644, &mut &bytes[..], bytes.len() as u64)
    }

    fn file(&mut self, path: &str, mode: u32, source: &mut impl Read, len: u64) -> io::Result<()> {
        self.header(path, mode, len, b'0')?;
        let copied = io::copy(&mut source.take(len), &mut self.out)?;
        if copied != len {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{path}: {copied} of {len} bytes")));
        }
        self.out.write_all(&vec![0; padding(len)])
    }

    fn header(&mut self, path: &str, mode: u32, len: u64, kind: u8) -> io::Result<()> {
        if path.len() >= 100 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{path}: name too long for ustar")));
        }
        let mut h = [0u8; 512];
        h[..path.len()].copy_from_slice(path.as_bytes());
        octal(&mut h[100..108], u64::from(mode));
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], len);
        octal(&mut h[136..148], 0);
        h[148..156].fill(b' ');
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        octal(&mut h[148..155], u64::from(sum));
        self.out.write_all(&h)
    }

    /// The two zero blocks that end an archive; the writer.
    fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[0; 1024])?;
        Ok(self.out)
    }
}

fn padding(len: u64) -> usize {
    ((512 - len % 512) % 512) as usize
}

/// `value` in octal, zero-padded, NUL-terminated, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let text = format!("{value:0width$o}\0", width = field.len() - 1);
    field.copy_from_slice(text.as_bytes());
}

/// The entries of a tar written by [`write`]: name and contents, for tests.
pub fn read_tar(path: &Path) -> io::Result<Vec<(String, u32, Vec<u8>)>> {
    let mut file = File::open(path)?;
    let mut entries = Vec::new();
    loop {
        let mut h = [0u8; 512];
        file.read_exact(&mut h)?;
        if h.iter().all(|b| *b == 0) {
            return Ok(entries);
        }
        let field = |r: std::ops::Range<usize>| {
            let text = String::from_utf8_lossy(&h[r]).trim_matches(|c| c == '\0' || c == ' ').to_string();
            u64::from_str_radix(&text, 8).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        };
        let stored: u64 = field(148..156)?;
        let mut blank = h;
        blank[148..156].fill(b' ');
        let sum: u64 = blank.iter().map(|b| u64::from(*b)).sum();
        if sum != stored {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "tar header checksum"));
        }
        let name = String::from_utf8_lossy(&h[..100]).trim_end_matches('\0').to_string();
        let (mode, len) = (field(100..108)? as u32, field(124..136)?);
        let mut body = vec![0; len as usize];
        file.read_exact(&mut body)?;
        file.seek(io::SeekFrom::Current(padding(len) as i64))?;
        entries.push((name, mode, body));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_names_as_the_kubelet_asks() {
        assert_eq!(containerd_name("hereabouts:0.1.0"), "docker.io/library/hereabouts:0.1.0");
        assert_eq!(containerd_name("example/hereabouts:1"), "docker.io/example/hereabouts:1");
        assert_eq!(containerd_name("registry.example:5000/x/hereabouts:1"), "registry.example:5000/x/hereabouts:1");
        assert_eq!(containerd_name("localhost/hereabouts:1"), "localhost/hereabouts:1");
    }

    #[test]
    fn octal_fields_are_padded_and_terminated() {
        let mut f = [0u8; 8];
        octal(&mut f, 0o755);
        assert_eq!(&f, b"0000755\0");
    }
}
