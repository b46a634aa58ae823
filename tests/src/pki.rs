//! The control plane's certificates and keys: a CA, a serving certificate for 127.0.0.1, `localhost` and
//! [`SERVER_NAME`] signed by it, and the service-account signing key. The CA is kept apart from the leaf because
//! rustls refuses a CA certificate as a server certificate.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A host name of the API server that only a test's own hosts file resolves (to 127.0.0.1).
pub const SERVER_NAME: &str = "apiserver.hereabouts.test";

#[derive(Debug)]
pub(crate) struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub sa_public_pem: String,
    pub sa_private_pem: String,
}

pub(crate) fn generate() -> Result<Pki, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "hereabouts-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), SERVER_NAME.to_string()])?;
    leaf.subject_alt_names.push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    leaf.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = leaf.signed_by(&serving_key, &issuer)?;

    let sa_key = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        sa_public_pem: sa_key.public_key_pem(),
        sa_private_pem: sa_key.serialize_pem(),
    })
}
