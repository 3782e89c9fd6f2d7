//! Sending OTLP profiles to a collector: gRPC (tonic, gzip) or HTTP/protobuf.
//!
//! # Configuration
//!
//! [`ExporterConfig::from_env`] reads the standard OpenTelemetry exporter variables, the
//! profiles signal's variant first (`OTEL_EXPORTER_OTLP_PROFILES_X`, then
//! `OTEL_EXPORTER_OTLP_X`); flags and the daemon's configuration override them afterwards:
//!
//! | Variable (`OTEL_EXPORTER_OTLP_[PROFILES_]…`) | Meaning | Default |
//! |---|---|---|
//! | `ENDPOINT` | the collector's URL | `http://localhost:4317` (gRPC), `http://localhost:4318` (HTTP) |
//! | `PROTOCOL` | `grpc` or `http/protobuf` | `grpc` |
//! | `HEADERS` | `key=value,…`, values percent-encoded | none |
//! | `COMPRESSION` | `gzip` or `none` | `gzip` |
//! | `TIMEOUT` | milliseconds per export | `10000` |
//! | `CERTIFICATE` | PEM file of the CA that signed the collector's certificate | the system's roots |
//! | `CLIENT_CERTIFICATE`, `CLIENT_KEY` | PEM files for mutual TLS | none |
//!
//! For HTTP, a profiles-specific endpoint is used as it is, and the generic one gets
//! [`HTTP_PATH`] appended, as the specification says for the other signals; an endpoint given
//! on the command line (`--otlp-endpoint`) gets the path only when it has none. `https://`
//! endpoints use TLS (rustls), `http://` ones plain text.
//!
//! # Outcomes
//!
//! [`Exporter::export`] returns what the collector said ([`Accepted`]: the profiles it rejected
//! and its message, for a partial success) or an [`ExportError`] that says whether trying again
//! later may help (the collector is unreachable, overloaded or timed out) or not (it refused the
//! request as malformed or unauthorized).

use std::path::PathBuf;
use std::time::Duration;
use symbolizer::debuginfod::without_credentials;

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;

/// The path of the profiles signal on an OTLP/HTTP receiver.
pub const HTTP_PATH: &str = "/v1development/profiles";

/// How requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`ProfilesService/Export`).
    Grpc,
    /// OTLP/HTTP with a binary protobuf body.
    HttpProtobuf,
}

impl Protocol {
    /// Parses `grpc` or `http/protobuf`.
    pub fn from_name(name: &str) -> Result<Protocol, String> {
        match name.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" | "http" => Ok(Protocol::HttpProtobuf),
            "http/json" => Err("OTLP protocol http/json is not supported: use grpc or \
                                http/protobuf"
                .to_string()),
            other => Err(format!(
                "unknown OTLP protocol {other:?}: use grpc or http/protobuf"
            )),
        }
    }

    /// The name [`Protocol::from_name`] parses.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how to send profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterConfig {
    /// The URL requests go to (for HTTP, with its path).
    pub endpoint: String,
    /// gRPC or HTTP.
    pub protocol: Protocol,
    /// Extra request headers (gRPC metadata), e.g. an API key.
    pub headers: Vec<(String, String)>,
    /// Compress requests with gzip.
    pub gzip: bool,
    /// Longest wait for one export.
    pub timeout: Duration,
    /// PEM file of a CA to trust (besides the system's roots).
    pub certificate: Option<PathBuf>,
    /// PEM files of a client certificate and its key, for mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` when the endpoint came from it: HTTP appends
    /// [`HTTP_PATH`] to it, gRPC uses it as it is, whichever protocol is set later.
    base_endpoint: Option<String>,
}

/// Where the configuration was read, for error messages.
fn var(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<(String, String)> {
    for full in [
        format!("OTEL_EXPORTER_OTLP_PROFILES_{name}"),
        format!("OTEL_EXPORTER_OTLP_{name}"),
    ] {
        if let Some(v) = get(&full).filter(|v| !v.trim().is_empty()) {
            return Some((full, v.trim().to_string()));
        }
    }
    None
}

/// True when a URL has no path beyond `/`.
fn has_no_path(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find('/') {
        None => true,
        Some(i) => rest[i..] == *"/",
    }
}

/// `url` with [`HTTP_PATH`] appended (one slash between).
fn with_http_path(url: &str) -> String {
    format!("{}{HTTP_PATH}", url.trim_end_matches('/'))
}

impl ExporterConfig {
    /// The endpoint as printed: the URL's user info (`user:password@`, which HTTP sends as basic
    /// authentication) as `***@`.
    pub fn shown_endpoint(&self) -> String {
        without_credentials(&self.endpoint)
    }

    /// The configuration from the process environment.
    pub fn from_env() -> Result<ExporterConfig, String> {
        Self::from_vars(&|name| std::env::var(name).ok())
    }

    /// The configuration from variables looked up by `get` (the environment, or a test's).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<ExporterConfig, String> {
        let protocol = match var(get, "PROTOCOL") {
            Some((name, v)) => Protocol::from_name(&v).map_err(|e| format!("{name}: {e}"))?,
            None => Protocol::Grpc,
        };
        let signal_endpoint =
            get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT").filter(|v| !v.trim().is_empty());
        let base_endpoint = match &signal_endpoint {
            Some(_) => None,
            None => get("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
        };
        let endpoint = match (signal_endpoint, base_endpoint.clone()) {
            (Some(signal), _) => signal.trim().to_string(),
            (None, Some(base)) if protocol == Protocol::HttpProtobuf => with_http_path(base.trim()),
            (None, Some(base)) => base.trim().to_string(),
            (None, None) => match protocol {
                Protocol::Grpc => "http://localhost:4317".to_string(),
                Protocol::HttpProtobuf => with_http_path("http://localhost:4318"),
            },
        };
        let headers = match var(get, "HEADERS") {
            Some((_, v)) => parse_headers(&v),
            None => Vec::new(),
        };
        let gzip = match var(get, "COMPRESSION") {
            Some((name, v)) => match v.as_str() {
                "gzip" => true,
                "none" => false,
                other => {
                    return Err(format!(
                        "{name}: unknown compression {other:?}: use gzip or none"
                    ))
                }
            },
            None => true,
        };
        let timeout = match var(get, "TIMEOUT") {
            Some((name, v)) => v
                .parse::<u64>()
                .ok()
                .filter(|&ms| ms > 0 && ms <= 3_600_000)
                .map(Duration::from_millis)
                .ok_or_else(|| format!("{name}: expected milliseconds, got {v:?}"))?,
            None => Duration::from_secs(10),
        };
        let certificate = var(get, "CERTIFICATE").map(|(_, v)| PathBuf::from(v));
        let client_identity = match (var(get, "CLIENT_CERTIFICATE"), var(get, "CLIENT_KEY")) {
            (Some((_, c)), Some((_, k))) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY go together".to_string(),
                )
            }
        };
        let config = ExporterConfig {
            endpoint,
            protocol,
            headers,
            gzip,
            timeout,
            certificate,
            client_identity,
            base_endpoint,
        };
        config.check()?;
        Ok(config)
    }

    /// Sets the endpoint from a command line or configuration file: for HTTP, a URL without a
    /// path gets [`HTTP_PATH`].
    pub fn set_endpoint(&mut self, url: &str) -> Result<(), String> {
        self.base_endpoint = None;
        self.endpoint = if self.protocol == Protocol::HttpProtobuf && has_no_path(url) {
            with_http_path(url)
        } else {
            url.to_string()
        };
        self.check()
    }

    /// Sets the protocol; an endpoint that was the other protocol's default follows.
    pub fn set_protocol(&mut self, protocol: Protocol) {
        if self.protocol == protocol {
            return;
        }
        if let Some(base) = &self.base_endpoint {
            self.endpoint = match protocol {
                Protocol::HttpProtobuf => with_http_path(base),
                Protocol::Grpc => base.clone(),
            };
            self.protocol = protocol;
            return;
        }
        let defaults = [
            "http://localhost:4317".to_string(),
            with_http_path("http://localhost:4318"),
        ];
        if defaults.contains(&self.endpoint) {
            self.endpoint = defaults[usize::from(protocol == Protocol::HttpProtobuf)].clone();
        }
        self.protocol = protocol;
    }

    fn check(&self) -> Result<(), String> {
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(format!(
                "OTLP endpoint {:?} must start with http:// or https://",
                self.shown_endpoint()
            ));
        }
        Ok(())
    }
}

/// `key=value,…` with percent-encoded values; entries without `=` or with a bad escape skipped.
pub fn parse_headers(s: &str) -> Vec<(String, String)> {
    crate::resource::parse_resource_attributes(s)
}

/// The collector took the request; it may have rejected some profiles (a partial success).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Profiles the collector rejected.
    pub rejected_profiles: i64,
    /// Its explanation, if it gave one.
    pub message: String,
}

/// An export that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExportError {
    /// Trying again later may succeed (unreachable, overloaded, timed out).
    pub retryable: bool,
    /// What happened.
    pub message: String,
}

impl ExportError {
    /// An error whose message has no URL user info ([`without_credentials`]).
    fn new(retryable: bool, message: impl Into<String>) -> Self {
        ExportError {
            retryable,
            message: without_credentials(&message.into()),
        }
    }
}

/// A connection (or connection pool) to one collector.
#[derive(Debug, Clone)]
pub struct Exporter {
    config: ExporterConfig,
    transport: Transport,
}

#[derive(Debug, Clone)]
enum Transport {
    Grpc(ProfilesServiceClient<tonic::transport::Channel>),
    Http(reqwest::Client),
}

fn read_pem(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl Exporter {
    /// Sets up the client; the connection is made at the first export (so a collector that is
    /// down at start is not an error). Needs a tokio runtime.
    pub fn new(config: ExporterConfig) -> Result<Exporter, String> {
        // A header that cannot be sent is a mistake to say now, not an export to retry.
        for (k, v) in &config.headers {
            let name_ok = !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok {
                return Err(format!("invalid OTLP header name {k:?}"));
            }
            if v.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(format!("invalid value of OTLP header {k:?}"));
            }
        }
        let ca = config.certificate.as_ref().map(read_pem).transpose()?;
        let identity = match &config.client_identity {
            Some((c, k)) => Some((read_pem(c)?, read_pem(k)?)),
            None => None,
        };
        let transport = match config.protocol {
            Protocol::Grpc => {
                use tonic::codec::CompressionEncoding;
                use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
                let mut endpoint = Endpoint::from_shared(config.endpoint.clone())
                    .map_err(|e| {
                        without_credentials(&format!(
                            "invalid OTLP endpoint {:?}: {e}",
                            config.endpoint
                        ))
                    })?
                    .timeout(config.timeout)
                    .connect_timeout(config.timeout);
                if config.endpoint.starts_with("https://") {
                    let mut tls = ClientTlsConfig::new().with_native_roots();
                    if let Some(ca) = &ca {
                        tls = tls.ca_certificate(Certificate::from_pem(ca));
                    }
                    if let Some((c, k)) = &identity {
                        tls = tls.identity(Identity::from_pem(c, k));
                    }
                    endpoint = endpoint.tls_config(tls).map_err(|e| {
                        without_credentials(&format!("TLS set-up for {}: {e}", config.endpoint))
                    })?;
                }
                let mut client = ProfilesServiceClient::new(endpoint.connect_lazy())
                    .accept_compressed(CompressionEncoding::Gzip);
                if config.gzip {
                    client = client.send_compressed(CompressionEncoding::Gzip);
                }
                Transport::Grpc(client)
            }
            Protocol::HttpProtobuf => {
                let mut builder = reqwest::Client::builder()
                    .timeout(config.timeout)
                    .connect_timeout(config.timeout)
                    .user_agent(concat!("spanprof/", env!("CARGO_PKG_VERSION")));
                if let Some(ca) = &ca {
                    let cert = reqwest::Certificate::from_pem(ca)
                        .map_err(|e| format!("CA certificate: {e}"))?;
                    builder = builder.add_root_certificate(cert);
                }
                if let Some((c, k)) = &identity {
                    let mut pem = c.clone();
                    pem.extend_from_slice(b"\n");
                    pem.extend_from_slice(k);
                    let id = reqwest::Identity::from_pem(&pem)
                        .map_err(|e| format!("client certificate: {e}"))?;
                    builder = builder.identity(id);
                }
                Transport::Http(
                    builder
                        .build()
                        .map_err(|e| format!("HTTP client set-up: {e}"))?,
                )
            }
        };
        Ok(Exporter { config, transport })
    }

    /// Where requests go.
    pub fn config(&self) -> &ExporterConfig {
        &self.config
    }

    /// Sends one request and waits for the collector's answer (at most the timeout).
    pub async fn export(
        &self,
        req: &ExportProfilesServiceRequest,
    ) -> Result<Accepted, ExportError> {
        let response = match &self.transport {
            Transport::Grpc(client) => self.export_grpc(client.clone(), req).await?,
            Transport::Http(client) => self.export_http(client, req).await?,
        };
        let partial = response.partial_success.unwrap_or_default();
        Ok(Accepted {
            rejected_profiles: partial.rejected_profiles,
            message: partial.error_message,
        })
    }

    async fn export_grpc(
        &self,
        mut client: ProfilesServiceClient<tonic::transport::Channel>,
        req: &ExportProfilesServiceRequest,
    ) -> Result<ExportProfilesServiceResponse, ExportError> {
        use tonic::metadata::{MetadataKey, MetadataValue};
        let mut request = tonic::Request::new(req.clone());
        for (k, v) in &self.config.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|_| ExportError::new(false, format!("invalid header name {k:?}")))?;
            let value = MetadataValue::try_from(v.as_str())
                .map_err(|_| ExportError::new(false, format!("invalid value of header {k:?}")))?;
            request.metadata_mut().insert(key, value);
        }
        match client.export(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => {
                use tonic::Code;
                let retryable = matches!(
                    status.code(),
                    Code::Unavailable
                        | Code::DeadlineExceeded
                        | Code::ResourceExhausted
                        | Code::Aborted
                        | Code::Cancelled
                        | Code::OutOfRange
                        | Code::DataLoss
                        | Code::Unknown
                );
                let mut message = format!("gRPC {:?}", status.code());
                if !status.message().is_empty() {
                    message = format!("{message}: {}", status.message());
                }
                Err(ExportError::new(retryable, message))
            }
        }
    }

    async fn export_http(
        &self,
        client: &reqwest::Client,
        req: &ExportProfilesServiceRequest,
    ) -> Result<ExportProfilesServiceResponse, ExportError> {
        let mut body = req.encode_to_vec();
        let mut request = client
            .post(&self.config.endpoint)
            .header("content-type", "application/x-protobuf");
        if self.config.gzip {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&body)
                .and_then(|()| gz.finish())
                .map(|compressed| body = compressed)
                .map_err(|e| ExportError::new(false, format!("gzip: {e}")))?;
            request = request.header("content-encoding", "gzip");
        }
        for (k, v) in &self.config.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = request.body(body).send().await.map_err(|e| {
            let what = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "cannot connect"
            } else {
                "request failed"
            };
            ExportError::new(true, format!("HTTP {what}: {}", error_chain(&e)))
        })?;
        let status = response.status();
        let bytes = response.bytes().await.unwrap_or_default();
        if !status.is_success() {
            let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
            let text: String = String::from_utf8_lossy(&bytes).chars().take(200).collect();
            return Err(ExportError::new(
                retryable,
                format!("HTTP {status}: {}", text.trim()),
            ));
        }
        // An empty body is a full success; one that does not decode is taken as one too (the
        // status said the request was accepted), rather than dropping a delivered window.
        Ok(ExportProfilesServiceResponse::decode(bytes.as_ref()).unwrap_or_default())
    }
}

/// An error and its causes on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Sends one request and waits for the answer, on a runtime of its own: the end of a
/// `profile` session and `verify`'s export check.
pub fn export_once(
    config: ExporterConfig,
    request: &ExportProfilesServiceRequest,
) -> Result<Accepted, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(async {
                let exporter = Exporter::new(config)?;
                exporter.export(request).await.map_err(|e| e.to_string())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<ExporterConfig, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ExporterConfig::from_vars(&move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_follow_the_protocol() {
        let c = config(&[]).unwrap();
        assert_eq!(
            (c.protocol, c.endpoint.as_str()),
            (Protocol::Grpc, "http://localhost:4317")
        );
        assert!(c.gzip);
        assert_eq!(c.timeout, Duration::from_secs(10));
        let c = config(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).unwrap();
        assert_eq!(c.endpoint, "http://localhost:4318/v1development/profiles");
    }

    #[test]
    fn printed_urls_hide_their_user_info() {
        for (text, shown) in [
            ("http://u:pw@host:4318/v1", "http://***@host:4318/v1"),
            ("https://pw@host", "https://***@host"),
            ("http://host:4317", "http://host:4317"),
            (
                "error sending request for url (http://a:b@c:1/x): refused",
                "error sending request for url (http://***@c:1/x): refused",
            ),
            (
                "\"http://a:p@ss@h\" and http://x@y?q=1#f",
                "\"http://***@h\" and http://***@y?q=1#f",
            ),
            ("no url here, user@host", "no url here, user@host"),
            ("(http://u:pa(ss)@h)", "(http://***@h)"),
            ("http://u:p@[::1]:4317", "http://***@[::1]:4317"),
            ("trailing ://", "trailing ://"),
        ] {
            assert_eq!(without_credentials(text), shown, "{text}");
        }
        let mut c = ExporterConfig::from_vars(&|_| None).unwrap();
        c.set_endpoint("http://me:s3cret@collector:4317").unwrap();
        assert_eq!(c.shown_endpoint(), "http://***@collector:4317");
        let e = c.set_endpoint("ftp://me:s3cret@collector").unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn profiles_variables_win_and_the_generic_endpoint_gets_the_path() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x=1"),
            ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ])
        .unwrap();
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.endpoint, "https://collector:4318/v1development/profiles");
        assert_eq!(
            c.headers,
            [
                ("api-key".to_string(), "a b".to_string()),
                ("x".to_string(), "1".to_string())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert!(!c.gzip);
        // The signal's own endpoint is used as it is.
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://c:9/custom"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:1"),
        ])
        .unwrap();
        assert_eq!(c.endpoint, "http://c:9/custom");
    }

    #[test]
    fn bad_values_are_named() {
        for (vars, needle) in [
            (
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "http/json",
            ),
            (vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")], "udp"),
            (
                vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")], "zstd"),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")],
                "http://",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem")],
                "go together",
            ),
        ] {
            let err = config(&vars).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn the_generic_endpoint_follows_a_protocol_set_later() {
        let mut c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
        assert_eq!(c.endpoint, "http://c:4318");
        c.set_protocol(Protocol::HttpProtobuf);
        assert_eq!(c.endpoint, "http://c:4318/v1development/profiles");
        c.set_protocol(Protocol::Grpc);
        assert_eq!(c.endpoint, "http://c:4318");
    }

    #[test]
    fn a_command_line_endpoint_gets_the_path_only_without_one() {
        let mut c = config(&[]).unwrap();
        c.set_protocol(Protocol::HttpProtobuf);
        assert_eq!(c.endpoint, "http://localhost:4318/v1development/profiles");
        c.set_endpoint("http://127.0.0.1:9000").unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9000/v1development/profiles");
        c.set_endpoint("http://127.0.0.1:9000/other").unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9000/other");
        c.set_protocol(Protocol::Grpc);
        c.set_endpoint("http://127.0.0.1:4317").unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:4317");
    }
}
