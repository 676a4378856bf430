//! TLS towards PostgreSQL (feature `postgres-tls`): tokio-postgres's `MakeTlsConnect` over
//! tokio-rustls with the ring provider, the same rustls etcd's TLS uses.
//!
//! What is verified follows libpq's `sslmode` (see [`PgSslMode`]): nothing under `prefer` and
//! `require` without a CA, the chain under `verify-ca` (and `require` with a CA, as libpq does
//! when it has a root certificate), the chain and the host name under `verify-full`. Channel
//! binding is not offered (SCRAM without it, which tokio-postgres accepts by default).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::Socket;

use super::PgSslMode;

/// The certificates of TLS towards PostgreSQL. `Debug` never shows the private key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PgTls {
    /// PEM of the certificate authority that signed the server's certificate; the platform's
    /// roots are not used. Needed by `verify-ca` and `verify-full`; with `require`, the chain
    /// is then verified too.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate and of its private key.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("client_certificate", &self.identity_pem.is_some())
            .finish()
    }
}

/// Why the TLS setup of a PostgreSQL store was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgTlsError {
    /// `verify-ca` or `verify-full` without a certificate authority.
    #[error("sslmode={0} needs the certificate authority (ca=) to verify against")]
    NoCa(PgSslMode),
    /// The CA's PEM holds no certificate rustls accepts as a trust anchor.
    #[error("the certificate authority holds no usable certificate")]
    Ca,
    /// The client certificate or key could not be read or does not fit.
    #[error("the client certificate and key are not usable: {0}")]
    Identity(&'static str),
    /// rustls refused the configuration.
    #[error("the TLS configuration was refused")]
    Rustls(#[from] rustls::Error),
}

/// Makes the TLS connector of each connection; cloning shares the configuration.
#[derive(Clone)]
pub(super) struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// The connector of `mode` with `tls`'s certificates.
    pub(super) fn new(mode: PgSslMode, tls: &PgTls) -> Result<MakeRustls, PgTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let roots = match &tls.ca_pem {
            Some(pem) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    roots.add(cert.map_err(|_| PgTlsError::Ca)?)?;
                }
                if roots.is_empty() {
                    return Err(PgTlsError::Ca);
                }
                Some(Arc::new(roots))
            }
            None => None,
        };
        let chain = |roots: Arc<RootCertStore>| {
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|_| PgTlsError::Ca)
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
            (PgSslMode::VerifyFull, Some(roots)) => chain(roots)?,
            (PgSslMode::VerifyCa | PgSslMode::Require, Some(roots)) => Arc::new(ChainOnly {
                inner: chain(roots)?,
            }),
            (PgSslMode::VerifyCa | PgSslMode::VerifyFull, None) => {
                return Err(PgTlsError::NoCa(mode))
            }
            _ => Arc::new(Unverified { provider }),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &tls.identity_pem {
            Some((cert, key)) => {
                let certs = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| PgTlsError::Identity("the certificate is not PEM"))?;
                if certs.is_empty() {
                    return Err(PgTlsError::Identity("no certificate"));
                }
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|_| PgTlsError::Identity("the key is not a PEM private key"))?;
                builder.with_client_auth_cert(certs, key)?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(MakeRustls {
            config: Arc::new(config),
        })
    }
}

impl MakeTlsConnect<Socket> for MakeRustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, io::Error> {
        // Called for every connection, plain ones and Unix sockets (empty `domain`) included:
        // the name is judged only when a handshake is made.
        Ok(RustlsConnect {
            config: self.config.clone(),
            domain: domain.to_owned(),
        })
    }
}

/// The TLS connector of one connection.
pub(super) struct RustlsConnect {
    config: Arc<ClientConfig>,
    domain: String,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream, io::Error>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.domain)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
            let stream = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A connection over TLS.
pub(super) struct RustlsStream(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// `prefer`, and `require` without a CA: the handshake's signatures are checked (the peer
/// holds the key of the certificate it shows) but not who signed the certificate.
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca` (and `require` with a CA): the chain up to the CA, not the host name. The
/// chain is checked before the name, so a name mismatch is the only error forgiven.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
