//! The project's release tooling, kept out of the test crate: the CRD manifests rendered from the Rust types
//! ([`crds`], `make crds`) and the image written as an OCI layout tar without a container daemon ([`image`],
//! `make image`). The integration tests use both (the committed `crds/` are checked against [`crds::render`], the
//! real node imports what [`image::write`] writes), so there is one copy of each.

pub mod crds;
pub mod image;
