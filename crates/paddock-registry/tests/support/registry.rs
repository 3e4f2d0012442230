//! A real registry on 127.0.0.1: Debian's `docker-registry` (distribution 2.8) with htpasswd
//! basic auth and TLS from a test CA, started as a child process and killed on drop (also when a
//! test panics).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub const USER: &str = "tester";
pub const PASSWORD: &str = "s3cret-pass";

/// The tools the fixture runs; `scripts/install-deps.sh` installs them.
const TOOLS: &[(&str, &str)] = &[
    ("docker-registry", "docker-registry"),
    ("skopeo", "skopeo"),
    ("umoci", "umoci"),
    ("htpasswd", "apache2-utils"),
];

pub fn require_tools() {
    for (tool, package) in TOOLS {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "`{tool}` is missing: these tests need Debian's {package} (run scripts/install-deps.sh)"
        );
    }
}

/// A running registry; its files live in `dir`.
pub struct TestRegistry {
    // First, so the registry is killed before its files are removed.
    _child: KillOnDrop,
    _dir: tempfile::TempDir,
    pub port: u16,
    /// The CA's certificate (PEM), for `PullOptions::extra_ca_file`.
    pub ca_file: PathBuf,
    /// A directory holding `ca.crt`, for skopeo's `--dest-cert-dir`.
    pub cert_dir: PathBuf,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

pub fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl TestRegistry {
    /// Starts a registry on a free loopback port and waits until `/v2/` answers.
    pub fn start() -> Self {
        require_tools();
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();

        // The test CA and the server's certificate for 127.0.0.1.
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "paddock registry test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key")).expect("ca");
        let server_key = KeyPair::generate().expect("server key");
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params")
            .signed_by(&server_key, &ca)
            .expect("server cert");
        let ca_file = root.join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write ca");
        let cert_dir = root.join("certs.d");
        std::fs::create_dir(&cert_dir).expect("certs dir");
        std::fs::write(cert_dir.join("ca.crt"), ca.pem()).expect("write ca.crt");
        std::fs::write(root.join("server.crt"), server.pem()).expect("write server cert");
        std::fs::write(root.join("server.key"), server_key.serialize_pem()).expect("write key");

        // bcrypt, as distribution's htpasswd auth requires.
        let htpasswd = run(Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]));
        std::fs::write(root.join("htpasswd"), htpasswd).expect("write htpasswd");
        std::fs::create_dir(root.join("storage")).expect("storage dir");

        let mut last_log = String::new();
        for _attempt in 0..3 {
            let port = free_port();
            let config = format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/storage\n\
                 http:\n  addr: 127.0.0.1:{port}\n  secret: paddock-test\n  tls:\n    certificate: {root}/server.crt\n    key: {root}/server.key\n\
                 auth:\n  htpasswd:\n    realm: paddock-test\n    path: {root}/htpasswd\n",
                root = root.display()
            );
            let config_path = root.join("config.yml");
            std::fs::write(&config_path, config).expect("write config");
            let log_path = root.join("registry.log");
            let log = std::fs::File::create(&log_path).expect("log file");
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log fd"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            let mut child = KillOnDrop(child);
            if wait_ready(&mut child.0, port, ca.der(), Duration::from_secs(20)) {
                return TestRegistry {
                    port,
                    ca_file,
                    cert_dir,
                    _child: child,
                    _dir: dir,
                };
            }
            // Probably lost the port to another process: try another (the drop kills the child).
            last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
        }
        panic!("docker-registry did not start: {last_log}");
    }

    /// `127.0.0.1:<port>`, as written in references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pushes the image `tag` of the OCI layout `layout` to `<host>/<repo>:<push_tag>` with
    /// skopeo (`--all`: an index and every manifest it lists).
    pub fn push(&self, layout: &Path, tag: &str, repo: &str, push_tag: &str) {
        self.push_as(layout, tag, repo, push_tag, None);
    }

    /// As [`TestRegistry::push`], converting to `format` (`v2s2`: Docker's schema 2 manifests, and
    /// an index becomes a Docker manifest list) on the way.
    pub fn push_as(&self, layout: &Path, tag: &str, repo: &str, push_tag: &str, format: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-creds"])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg("--dest-cert-dir")
            .arg(&self.cert_dir);
        cmd.arg("--all");
        if let Some(f) = format {
            cmd.args(["--format", f]);
        }
        run(cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{push_tag}", self.host())));
    }
}

/// The registry process, killed and reaped when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `GET /v2/` over TLS (trusting only the test CA) until the registry answers `401`
/// (auth is on), the child exits, or the deadline passes.
fn wait_ready(child: &mut Child, port: u16, ca_der: &[u8], timeout: Duration) -> bool {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .expect("add CA");
    let config = Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if let Some(status) = get_v2(port, config.clone()) {
            if status.starts_with("HTTP/1.1 401") || status.starts_with("HTTP/1.1 200") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn get_v2(port: u16, config: Arc<rustls::ClientConfig>) -> Option<String> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").ok()?;
    let conn = rustls::ClientConnection::new(config, name).ok()?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut head = [0u8; 32];
    let n = tls.read(&mut head).ok()?;
    Some(String::from_utf8_lossy(&head[..n]).into_owned())
}
