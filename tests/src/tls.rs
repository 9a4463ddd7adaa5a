//! A certificate authority made by the test, for the https push tests
//! (tests/tests/it/agent_sinks.rs): its PEM for `--push-ca`, and server certificates for
//! `127.0.0.1` and `localhost` that it signs — valid now, or expired — as rustls server
//! configurations for the receiver of tests/src/pyroscope.rs.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// How long a server certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    /// From yesterday for a year.
    Now,
    /// Through 2021 only.
    Expired,
}

impl TestCa {
    /// A new CA with a fresh key, named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        TestCa { issuer }
    }

    /// The CA certificate, PEM (what `--push-ca` reads).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A TLS server for `127.0.0.1` and `localhost` whose certificate this CA signs.
    pub fn server(&self, validity: Validity) -> Arc<rustls::ServerConfig> {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "cpi-bpf test receiver");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let at = |secs: i64| {
            rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs as u64)
        };
        (params.not_before, params.not_after) = match validity {
            Validity::Now => (at(now - 86_400), at(now + 365 * 86_400)),
            Validity::Expired => (
                rcgen::date_time_ymd(2021, 1, 1),
                rcgen::date_time_ymd(2021, 12, 31),
            ),
        };
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        Arc::new(config)
    }
}
