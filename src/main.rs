//! The `allot` binary: parse the command line, set up logging, run one command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use allot::check;
use allot::engine::Engine;
use allot::gang::controller::ControllerConfig;
use allot::namespaces::{self, NamespaceLabels, NoNamespaces};
use allot::quota::StaticUsage;
use allot::server::{self, ServeConfig};
use allot::suite;
use allot::webhooks::{self, Endpoint, WebhookOptions};

/// Admission policies for Kubernetes clusters with scarce, shared accelerators.
#[derive(Parser)]
#[command(name = "allot", version, about)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text", env = "ALLOT_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
    Junit,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the mutating and validating webhooks over HTTPS.
    Serve {
        /// Directory of policy files (reloaded when they change).
        #[arg(long)]
        policies: PathBuf,
        /// Serving certificate chain (PEM; reloaded when it changes).
        #[arg(long)]
        tls_cert: PathBuf,
        /// Serving private key (PEM).
        #[arg(long)]
        tls_key: PathBuf,
        /// Require a client certificate signed by this CA (PEM; reloaded with the serving
        /// certificate): only the API server, configured to present one, can call the webhooks.
        #[arg(long)]
        client_ca: Option<PathBuf>,
        #[arg(long, default_value = "0.0.0.0:8443")]
        addr: SocketAddr,
        /// Plain-HTTP address for /metrics, /healthz and /readyz.
        #[arg(long, default_value = "0.0.0.0:9090")]
        metrics_addr: SocketAddr,
        /// Largest AdmissionReview accepted (bytes); the API server's own object limit is 3 MiB.
        #[arg(long, default_value_t = 4 * 1024 * 1024)]
        max_body_bytes: usize,
        /// Per-request deadline in milliseconds; keep it well under the webhook's timeoutSeconds.
        #[arg(long, default_value_t = 2000)]
        request_timeout_ms: u64,
        /// Time a connection has to send a complete request head (and to finish the TLS
        /// handshake), in milliseconds; on HTTP/1.1 also how long an idle keep-alive
        /// connection stays open. Cuts off slow-header (slowloris) clients.
        #[arg(long, default_value_t = 15_000)]
        header_read_timeout_ms: u64,
        /// Most webhook connections open at once; more are closed at accept, so a flood of
        /// connections cannot exhaust the server. The metrics address is not counted.
        #[arg(long, default_value_t = 1024)]
        max_connections: usize,
        /// Fallback poll for changed policy and certificate files, in seconds.
        #[arg(long, default_value_t = 10)]
        reload_interval_secs: u64,
        /// Grace period for in-flight requests on SIGTERM, in seconds.
        #[arg(long, default_value_t = 10)]
        shutdown_grace_secs: u64,
        /// Do not use the Kubernetes API: no Namespace watch (Team label selectors cannot
        /// match) and no gang controller.
        #[arg(long, alias = "no-namespace-watch")]
        no_kube: bool,
        /// Do not run the gang controller on this replica.
        #[arg(long)]
        no_gang_controller: bool,
        /// Namespace of the gang controller's leader-election Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "allot-system")]
        lease_namespace: String,
        /// This replica's name in the Lease (default: the host name).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Full re-evaluation of waiting gangs even without events, in seconds.
        #[arg(long, default_value_t = 30)]
        resync_secs: u64,
        /// Allot's own user name as the API server reports it (its service account): the only
        /// identity allowed to remove Allot's scheduling gates and change its reserved keys.
        #[arg(long, env = "ALLOT_USERNAME", default_value = allot::tenant::DEFAULT_ALLOT_USERNAME)]
        allot_username: String,
    },
    /// Dry-run manifests against policies, as the webhooks would (exit 0 admitted, 1 denied, 2 error).
    Check {
        #[arg(long)]
        policies: PathBuf,
        /// Namespace manifests whose labels Team selectors are evaluated against.
        #[arg(long)]
        namespaces: Option<PathBuf>,
        /// Current usage per team (`teams: {vision: {nvidia.com/gpu: 6}}`), for deny-mode quotas.
        #[arg(long)]
        state: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
        /// Manifests: files, directories, or - for stdin.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Run test files: expected outcomes per resource (exit 0 all pass, 1 a case failed, 2 bad tests).
    Test {
        /// Policy directory (or file) for every test, instead of the `policies` each names.
        #[arg(long)]
        policies: Option<PathBuf>,
        /// Also write a JUnit XML report: one test case per case, a failure per mismatch.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Test files, or directories searched recursively for them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Write a CA and a serving certificate (reuses an existing CA in --out).
    Certs {
        #[arg(long)]
        out: PathBuf,
        /// DNS names (or IP addresses) of the serving certificate.
        #[arg(long = "dns-name", required = true)]
        dns_names: Vec<String>,
        /// Validity of the serving certificate.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
    /// Print the MutatingWebhookConfiguration and ValidatingWebhookConfiguration to apply.
    Webhooks {
        /// CA certificate (PEM) the API server uses to verify Allot.
        #[arg(long)]
        ca_bundle: PathBuf,
        /// In-cluster Service as NAMESPACE/NAME.
        #[arg(long, conflicts_with = "url", required_unless_present = "url")]
        service: Option<String>,
        /// URL of an Allot outside the cluster (https://host:port).
        #[arg(long)]
        url: Option<String>,
        #[arg(long, default_value = "allot")]
        name: String,
        #[arg(long, value_parser = ["Fail", "Ignore"], default_value = "Fail")]
        failure_policy: String,
        #[arg(long, default_value_t = 5)]
        timeout_seconds: i32,
        /// More namespaces to leave alone (kube-system and Allot's own always are).
        #[arg(long = "exclude-namespace")]
        exclude_namespaces: Vec<String>,
        /// Allot's service account name; its own requests skip the webhooks.
        #[arg(long, default_value = "allot")]
        service_account: String,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: `kubectl logs` and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    allot::install_crypto_provider();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // After logging: a panic is then one log line, not a message and backtrace on stderr.
    allot::expression::install_panic_hook();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("allot: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve {
            policies,
            tls_cert,
            tls_key,
            client_ca,
            addr,
            metrics_addr,
            max_body_bytes,
            request_timeout_ms,
            header_read_timeout_ms,
            max_connections,
            reload_interval_secs,
            shutdown_grace_secs,
            no_kube,
            no_gang_controller,
            lease_namespace,
            identity,
            resync_secs,
            allot_username,
        } => {
            let identity = identity
                .or_else(|| std::env::var("HOSTNAME").ok())
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
                .unwrap_or_else(|| format!("allot-{}", std::process::id()));
            let gang_controller = (!no_gang_controller).then(|| ControllerConfig {
                lease_namespace,
                lease_name: "allot-gang-controller".into(),
                identity,
                resync: Duration::from_secs(resync_secs.max(1)),
            });
            let config = ServeConfig {
                policies,
                tls_cert,
                tls_key,
                client_ca,
                addr,
                metrics_addr,
                max_body_bytes,
                request_timeout: Duration::from_millis(request_timeout_ms),
                header_read_timeout: Duration::from_millis(header_read_timeout_ms.max(1)),
                max_connections: max_connections.max(1),
                reload_interval: Duration::from_secs(reload_interval_secs.max(1)),
                shutdown_grace: Duration::from_secs(shutdown_grace_secs),
                use_kube: !no_kube,
                gang_controller,
                allot_username,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(server::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { policies, namespaces: namespaces_file, state, output, paths } => {
            let policies = allot::policy::load_dir(&policies)?;
            let labels: Box<dyn NamespaceLabels> = match namespaces_file {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    Box::new(
                        namespaces::from_manifests(&path.display().to_string(), &text).map_err(anyhow::Error::msg)?,
                    )
                }
                None => Box::new(NoNamespaces),
            };
            let manifests = check::read_manifests(&paths)?;
            // Usage from --state, plus what the run's own manifests take, in order.
            let usage = match state {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    StaticUsage::parse(&path.display().to_string(), &text).map_err(anyhow::Error::msg)?
                }
                None => StaticUsage::default(),
            };
            let engine = Engine::new(&policies, labels.as_ref()).with_quota(&usage);
            let report = check::run(&engine, &manifests);
            let text = match output {
                Output::Text => check::render_text(&report),
                Output::Json => check::render_json(&report),
                Output::Junit => check::render_junit(&report),
            };
            print!("{text}");
            Ok(if report.all_admitted() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Test { policies, junit, paths } => {
            let suite = suite::load(&paths, policies.as_deref())?;
            let report = suite.run();
            print!("{}", report.render_text());
            if let Some(path) = junit {
                report.write_junit(&path)?;
            }
            Ok(if report.all_passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Certs { out, dns_names, days } => {
            let written = allot::certs::generate(&out, &dns_names, days)?;
            println!(
                "{} CA {}; serving certificate {} and key {} for {}",
                if written.reused_ca { "reused" } else { "created" },
                written.ca_cert.display(),
                written.cert.display(),
                written.key.display(),
                dns_names.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Webhooks {
            ca_bundle,
            service,
            url,
            name,
            failure_policy,
            timeout_seconds,
            exclude_namespaces,
            service_account,
        } => {
            let ca = std::fs::read(&ca_bundle).map_err(|e| anyhow::anyhow!("{}: {e}", ca_bundle.display()))?;
            let (endpoint, sa_namespace) = match (service, url) {
                (Some(s), _) => {
                    let (namespace, name) = s
                        .split_once('/')
                        .filter(|(n, s)| !n.is_empty() && !s.is_empty())
                        .ok_or_else(|| anyhow::anyhow!("--service must be NAMESPACE/NAME, got {s:?}"))?;
                    (Endpoint::Service { namespace: namespace.into(), name: name.into() }, Some(namespace.to_string()))
                }
                (None, Some(u)) => {
                    anyhow::ensure!(u.starts_with("https://"), "--url must start with https://, got {u:?}");
                    (Endpoint::Url(u), None)
                }
                (None, None) => anyhow::bail!("give --service NAMESPACE/NAME or --url URL"),
            };
            let opts = WebhookOptions {
                endpoint,
                ca_bundle: ca,
                name,
                failure_policy,
                timeout_seconds,
                exclude_namespaces,
                service_account: sa_namespace.map(|ns| format!("system:serviceaccount:{ns}:{service_account}")),
            };
            print!("{}", webhooks::render_yaml(&opts).map_err(anyhow::Error::msg)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
