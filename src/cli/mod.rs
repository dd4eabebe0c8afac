//! The command line: clap argument structs, one per command, each converted into the config its
//! command takes (`From`/`TryFrom`), and [`run`], which dispatches. Kept out of `main.rs` so the
//! binary stays a few lines of process set-up, and so the flags and the configs they fill can be
//! read side by side. Flag names, environment variables and defaults are public surface:
//! `tests/deploy.rs` compares the Deployment with `allot serve --help`, `tests/cli.rs` runs them.
//!
//! `anyhow` lives here (an edge); the library below returns typed errors.

pub mod certs;
pub mod check;
pub mod explain;
pub mod github;
pub mod junit;
pub mod suite;
pub mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::admission::engine::Engine;
use crate::admission::quota::StaticUsage;
use crate::cli::webhooks::{Endpoint, WebhookOptions};
use crate::control::gang::controller::ControllerConfig;
use crate::model::namespaces::{self, NamespaceLabels, NoNamespaces};
use crate::model::policy::schema;
pub use crate::server::logging::LogFormat;
use crate::server::{self, ServeConfig};

/// Admission policies for Kubernetes clusters with scarce, shared accelerators.
#[derive(Parser)]
#[command(name = "allot", version, about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text", env = "ALLOT_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// The file name kubectl runs a plugin by: `kubectl allot explain …` executes
/// `kubectl-allot explain …`, so a link of that name to `allot` on PATH is the plugin.
pub const KUBECTL_PLUGIN: &str = "kubectl-allot";

impl Cli {
    /// Parses the process's arguments (exits with clap's message on bad ones), with the usage
    /// lines of [`command`]; run as [`KUBECTL_PLUGIN`], usage and help say `kubectl allot`.
    pub fn parse_args() -> Self {
        let argv0 = std::env::args_os().next();
        let plugin = argv0.as_deref().map(std::path::Path::new).and_then(std::path::Path::file_name).is_some_and(|n| {
            let n = n.to_string_lossy();
            n == KUBECTL_PLUGIN || n == format!("{KUBECTL_PLUGIN}.exe")
        });
        let matches = command_named(if plugin { "kubectl allot" } else { "allot" }).get_matches();
        match Cli::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }
}

/// The command tree, with every command's usage line fixed to the one its `--help` shows.
/// clap's error messages otherwise rebuild the line from the arguments given, and so list the
/// optional global `--log-format` (given, or set by `ALLOT_LOG_FORMAT`) as if it were required.
pub fn command() -> clap::Command {
    command_named("allot")
}

/// [`command`] under the name its usage lines show.
fn command_named(bin: &str) -> clap::Command {
    let mut cli = <Cli as CommandFactory>::command().bin_name(bin.to_string());
    cli.build();
    fix_usage(cli)
}

fn fix_usage(mut command: clap::Command) -> clap::Command {
    let names: Vec<String> = command.get_subcommands().map(|c| c.get_name().to_string()).collect();
    for name in names {
        command = command.mut_subcommand(&name, |mut sub| {
            let usage = sub.render_usage().to_string();
            let usage = usage.trim().trim_start_matches("Usage:").trim().to_string();
            fix_usage(sub.override_usage(usage))
        });
    }
    command
}

/// How `allot check` prints its report.
#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    /// A verdict per object, with its changes, patch and findings.
    Text,
    /// The whole report as one JSON document.
    Json,
    /// JUnit XML: a test case per object, a failure per denied object.
    Junit,
    /// GitHub Actions workflow commands: an annotation on the file and line of each finding.
    Github,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve the mutating and validating webhooks over HTTPS.
    Serve(ServeArgs),
    /// Dry-run manifests against policies, as the webhooks would (exit 0 admitted, 1 denied, 2 error).
    Check(CheckArgs),
    /// Run test files: expected outcomes per resource (exit 0 all pass, 1 a case failed, 2 bad tests).
    Test(TestArgs),
    /// Write a CA and a serving certificate (reuses an existing CA in --out).
    Certs(CertsArgs),
    /// Print the MutatingWebhookConfiguration and ValidatingWebhookConfiguration to apply.
    Webhooks(WebhooksArgs),
    /// Why is a pod waiting? Explains a pod, a gang or a team from the live cluster, with the
    /// gang controller's own decision code (also `kubectl allot explain`).
    Explain(ExplainArgs),
    /// Print the JSON Schema of policy files, for editors (yaml-language-server) and CI.
    Schema(SchemaArgs),
    /// Compile the stateless policies into native Mutating/ValidatingAdmissionPolicies (report on stderr).
    Compile(CompileArgs),
}

// `allot explain`'s flags.
#[derive(Args)]
pub struct ExplainArgs {
    /// What to explain.
    #[arg(value_enum)]
    pub subject: ExplainSubject,
    /// The pod's, gang's or team's name.
    pub name: String,
    /// Namespace of the pod or gang (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else the in-cluster account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: ExplainOutput,
    /// Policy directory to decide with (default: the ConfigMap --policies-configmap, the
    /// policies the cluster's Allot reads).
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// NAMESPACE/NAME of the ConfigMap holding the cluster's policies, read when --policies is
    /// not given.
    #[arg(long, default_value = crate::cli::explain::live::DEFAULT_POLICIES_CONFIGMAP)]
    pub policies_configmap: String,
    /// Give up when the cluster has not answered everything within this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExplainSubject {
    /// One pod: its gates, team, gang, and what holds it.
    Pod,
    /// One gang: members present and declared, which nodes could take them, its timeout.
    Gang,
    /// One team: its quota, usage by namespace and pod, and its queue.
    Team,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExplainOutput {
    /// For people: a few lines per subject.
    Text,
    /// For tools: one JSON document (structure in docs/src/explain.md).
    Json,
}

// `allot serve`'s flags; they become a [`ServeConfig`].
#[derive(Args)]
pub struct ServeArgs {
    /// Directory of policy files (reloaded when they change).
    #[arg(long)]
    pub policies: PathBuf,
    /// Serving certificate chain (PEM; reloaded when it changes).
    #[arg(long)]
    pub tls_cert: PathBuf,
    /// Serving private key (PEM).
    #[arg(long)]
    pub tls_key: PathBuf,
    /// Require a client certificate signed by this CA (PEM; reloaded with the serving
    /// certificate): only the API server, configured to present one, can call the webhooks.
    #[arg(long)]
    pub client_ca: Option<PathBuf>,
    /// HTTPS address of the webhooks (/mutate, /validate).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Plain-HTTP address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Largest AdmissionReview accepted (bytes); the API server's own object limit is 3 MiB.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Per-request deadline in milliseconds; keep it well under the webhook's timeoutSeconds.
    #[arg(long, default_value_t = 2000)]
    pub request_timeout_ms: u64,
    /// Reviews up to this many bytes are evaluated in place, without the hand-off to the
    /// evaluation pool, when every Rule and Placement condition is linear (no nested or
    /// list-building comprehension, no regular expression); 0 sends every review to the pool.
    #[arg(long, default_value_t = crate::server::DEFAULT_INLINE_BODY_BYTES)]
    pub inline_evaluation_max_bytes: usize,
    /// Time a connection has to send a complete request head (and to finish the TLS
    /// handshake), in milliseconds; on HTTP/1.1 also how long an idle keep-alive
    /// connection stays open. Cuts off slow-header (slowloris) clients.
    #[arg(long, default_value_t = 15_000)]
    pub header_read_timeout_ms: u64,
    /// Most webhook connections open at once; more are closed at accept, so a flood of
    /// connections cannot exhaust the server. The metrics address is not counted.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Fallback poll for changed policy and certificate files, in seconds.
    #[arg(long, default_value_t = 10)]
    pub reload_interval_secs: u64,
    /// Grace period for in-flight requests on SIGTERM, in seconds.
    #[arg(long, default_value_t = 10)]
    pub shutdown_grace_secs: u64,
    /// Do not use the Kubernetes API: no Namespace watch (Team label selectors cannot
    /// match) and no gang controller.
    #[arg(long, alias = "no-namespace-watch")]
    pub no_kube: bool,
    /// Do not run the gang controller on this replica.
    #[arg(long)]
    pub no_gang_controller: bool,
    /// Namespace of the gang controller's leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "allot-system")]
    pub lease_namespace: String,
    /// This replica's name in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Full re-evaluation of waiting gangs even without events, in seconds.
    #[arg(long, default_value_t = 30)]
    pub resync_secs: u64,
    /// How the Pod cache fills at start: `streaming` (a watch that begins with every Pod,
    /// served from the API server's watch cache) or `paged` (LIST in pages of 500, for API
    /// servers with the WatchList feature off).
    #[arg(long, value_enum, default_value = "streaming", env = "ALLOT_INITIAL_LIST")]
    pub initial_list: crate::control::gang::controller::InitialList,
    /// Allot's own user name: the only identity allowed to remove Allot's scheduling gates and
    /// change its reserved keys. By default Allot asks the API server who it is at start
    /// (SelfSubjectReview); this flag is for webhook replicas that cannot ask (no kubeconfig,
    /// `--no-kube`), where it names the identity the gang controller writes as. Where the API
    /// server answers, a different name here stops `allot serve` (exit 2). Without either:
    /// system:serviceaccount:allot-system:allot.
    #[arg(long, env = "ALLOT_USERNAME")]
    pub allot_username: Option<String>,
}

/// The Lease name every replica competes for; not a flag, since replicas must agree on it.
const GANG_LEASE_NAME: &str = "allot-gang-controller";

/// This replica's Lease identity when `--identity`/`POD_NAME` is not given: the host name
/// (unique per Pod), else one made from the process id.
fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_else(|| format!("allot-{}", std::process::id()))
}

/// Durations from their flag units; zero is raised to the least that makes sense where a zero
/// would spin (poll and resync intervals) or refuse every connection (caps and header timeout).
impl From<ServeArgs> for ServeConfig {
    fn from(args: ServeArgs) -> Self {
        let gang_controller = (!args.no_gang_controller).then(|| ControllerConfig {
            lease_namespace: args.lease_namespace,
            lease_name: GANG_LEASE_NAME.into(),
            identity: args.identity.unwrap_or_else(default_identity),
            resync: Duration::from_secs(args.resync_secs.max(1)),
            initial_list: args.initial_list,
        });
        ServeConfig {
            policies: args.policies,
            tls_cert: args.tls_cert,
            tls_key: args.tls_key,
            client_ca: args.client_ca,
            addr: args.addr,
            metrics_addr: args.metrics_addr,
            max_body_bytes: args.max_body_bytes,
            request_timeout: Duration::from_millis(args.request_timeout_ms),
            inline_body_bytes: args.inline_evaluation_max_bytes,
            header_read_timeout: Duration::from_millis(args.header_read_timeout_ms.max(1)),
            max_connections: args.max_connections.max(1),
            reload_interval: Duration::from_secs(args.reload_interval_secs.max(1)),
            shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
            use_kube: !args.no_kube,
            gang_controller,
            allot_username: args.allot_username,
        }
    }
}

// `allot check`'s flags.
#[derive(Args)]
pub struct CheckArgs {
    /// Directory (or file) of policies to check the manifests against.
    #[arg(long)]
    pub policies: PathBuf,
    /// Namespace manifests whose labels Team selectors are evaluated against.
    #[arg(long)]
    pub namespaces: Option<PathBuf>,
    /// Current usage per team (`teams: {vision: {nvidia.com/gpu: 6}}`), for deny-mode quotas.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Report format; `github` annotates the file and line of each finding in a workflow run.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
    /// Manifests: files, directories, or - for stdin. None: only load the policies (a lint:
    /// exit 0 when they load, 2 with every error when they do not).
    pub paths: Vec<PathBuf>,
}

// `allot test`'s flags.
#[derive(Args)]
pub struct TestArgs {
    /// Policy directory (or file) for every test, instead of the `policies` each names.
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// Also write a JUnit XML report: one test case per case, a failure per mismatch.
    #[arg(long, conflicts_with = "server")]
    pub junit: Option<PathBuf>,
    /// Run the cases against the native policies (`allot compile` output, applied beforehand)
    /// in the API server of this kubeconfig, by server-side dry-run creates, instead of the
    /// engine. The cases' namespaces must exist; cases the native policies cannot answer alone
    /// are reported as skipped (webhook-only), never as passed.
    #[arg(long, value_name = "KUBECONFIG")]
    pub server: Option<PathBuf>,
    /// Test files, or directories searched recursively for them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

// `allot certs`'s flags.
#[derive(Args)]
pub struct CertsArgs {
    /// Directory for ca.crt, ca.key, tls.crt and tls.key (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// DNS names (or IP addresses) of the serving certificate.
    #[arg(long = "dns-name", required = true)]
    pub dns_names: Vec<String>,
    /// Validity of the serving certificate, in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

// `allot webhooks`'s flags; they become [`WebhookOptions`] (reading the CA file, hence `TryFrom`).
#[derive(Args)]
pub struct WebhooksArgs {
    /// CA certificate (PEM) the API server uses to verify Allot.
    #[arg(long)]
    pub ca_bundle: PathBuf,
    /// In-cluster Service as NAMESPACE/NAME.
    #[arg(long, conflicts_with = "url", required_unless_present = "url")]
    pub service: Option<String>,
    /// URL of an Allot outside the cluster (https://host:port).
    #[arg(long)]
    pub url: Option<String>,
    /// metadata.name of both webhook configurations.
    #[arg(long, default_value = "allot")]
    pub name: String,
    /// What the API server does when Allot cannot be reached: refuse the request, or admit it
    /// unchecked.
    #[arg(long, value_parser = failure_policies(), default_value = "Fail")]
    pub failure_policy: String,
    /// How long the API server waits for Allot per request, in seconds (the API server accepts
    /// 1 to 30).
    #[arg(long, default_value_t = 5)]
    pub timeout_seconds: i32,
    /// More namespaces to leave alone (kube-system and Allot's own always are).
    #[arg(long = "exclude-namespace")]
    pub exclude_namespaces: Vec<String>,
    /// Allot's service account name; its own requests skip the webhooks.
    #[arg(long, default_value = "allot")]
    pub service_account: String,
    /// Policy directory whose native policies (`allot compile` output) are installed beside the
    /// webhooks: the webhooks then leave out what those do. Their fingerprint goes into the
    /// webhook paths; Allot honours it only while its own policies compile to the same objects.
    #[arg(long, value_name = "POLICIES")]
    pub native_covers: Option<PathBuf>,
}

/// `--failure-policy`'s values, each explained in `--help`.
fn failure_policies() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("Fail").help("Refuse the request: nothing is admitted unchecked (Allot's advice)"),
        PossibleValue::new("Ignore").help("Admit the request unchecked"),
    ])
}

// `allot schema`'s flags.
#[derive(Args)]
pub struct SchemaArgs {
    /// Only this kind's documents (Cluster, Team, Placement, Rule, GangPolicy; or Test, the
    /// `allot test` files) instead of every policy kind's, chosen by `kind`.
    #[arg(long, conflicts_with = "out")]
    pub kind: Option<String>,
    /// Write allot.schema.json (every policy kind), one KIND.schema.json per policy kind and
    /// test.schema.json (test files) into this directory instead of printing.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

// `allot compile`'s flags.
#[derive(Args)]
pub struct CompileArgs {
    /// Directory of policy files.
    #[arg(long)]
    pub policies: PathBuf,
    /// Where to write the objects (YAML); `-` is stdout.
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
    /// Exit 1 when any part of a policy stays webhook-only.
    #[arg(long)]
    pub strict: bool,
    /// Allot's own user name (as `allot serve --allot-username`): the native policies skip it
    /// as the webhooks do, so they never refuse the gang controller a gate lift.
    #[arg(long, env = "ALLOT_USERNAME", default_value = crate::admission::tenant::DEFAULT_ALLOT_USERNAME)]
    pub allot_username: String,
}

/// `allot compile`: objects to `--out`, the per-policy report to stderr. Exit 0, or 1 under
/// `--strict` when something stays webhook-only; a bad policy is an error (exit 2).
fn run_compile(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let policies = crate::model::policy::load_dir(&args.policies)?;
    let compiled = crate::admission::native::compile_for(&policies, &args.allot_username);
    // The fingerprint of the default identity's objects, whatever `--allot-username` says: the
    // one `allot webhooks --native-covers` and `allot test --server` work out from the policies.
    let fingerprint = crate::admission::covers::fingerprint(&crate::admission::native::compile(&policies))
        .ok_or_else(|| anyhow::anyhow!("the compiled objects cannot be rendered"))?;
    let yaml = compiled.to_yaml_from(&fingerprint)?;
    if args.out.as_os_str() == "-" {
        print!("{yaml}");
    } else {
        std::fs::write(&args.out, yaml).map_err(|e| anyhow::anyhow!("{}: {e}", args.out.display()))?;
    }
    eprint!("{}", compiled.report_text());
    Ok(if args.strict && !compiled.fully_native() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The endpoint from `--service NAMESPACE/NAME` or `--url`, and the namespace of Allot's service
/// account (known only for an in-cluster Service).
fn endpoint_of(service: Option<String>, url: Option<String>) -> anyhow::Result<(Endpoint, Option<String>)> {
    match (service, url) {
        (Some(s), _) => {
            let (namespace, name) = s
                .split_once('/')
                .filter(|(n, s)| !n.is_empty() && !s.is_empty())
                .ok_or_else(|| anyhow::anyhow!("--service must be NAMESPACE/NAME, got {s:?}"))?;
            Ok((Endpoint::Service { namespace: namespace.into(), name: name.into() }, Some(namespace.to_string())))
        }
        (None, Some(u)) => {
            anyhow::ensure!(u.starts_with("https://"), "--url must start with https://, got {u:?}");
            Ok((Endpoint::Url(u), None))
        }
        (None, None) => anyhow::bail!("give --service NAMESPACE/NAME or --url URL"),
    }
}

impl TryFrom<WebhooksArgs> for WebhookOptions {
    type Error = anyhow::Error;

    fn try_from(args: WebhooksArgs) -> anyhow::Result<Self> {
        let ca_bundle =
            std::fs::read(&args.ca_bundle).map_err(|e| anyhow::anyhow!("{}: {e}", args.ca_bundle.display()))?;
        let (endpoint, sa_namespace) = endpoint_of(args.service, args.url)?;
        let service_account = args.service_account;
        let service_account = sa_namespace.map(|ns| format!("system:serviceaccount:{ns}:{service_account}"));
        let native_fingerprint = match &args.native_covers {
            Some(dir) => Some(native_fingerprint(dir)?),
            None => None,
        };
        Ok(WebhookOptions {
            endpoint,
            ca_bundle,
            name: args.name,
            failure_policy: args.failure_policy,
            timeout_seconds: args.timeout_seconds,
            exclude_namespaces: args.exclude_namespaces,
            service_account,
            native_fingerprint,
        })
    }
}

/// `--native-covers DIR`: the fingerprint of DIR's compiled native policies; what the webhooks
/// leave to them goes to stderr.
fn native_fingerprint(dir: &std::path::Path) -> anyhow::Result<String> {
    let sources = crate::model::policy::read_sources(dir)?;
    let split = crate::admission::covers::NativeSplit::from_sources(&sources)?;
    eprintln!(
        "native policies {} (apply `allot compile --policies {}` with these webhooks); left to them:",
        split.fingerprint,
        dir.display()
    );
    for line in split.covered.describe() {
        eprintln!("    {line}");
    }
    Ok(split.fingerprint)
}

/// Runs one command; the exit code says how it went (errors are the caller's to print, exit 2).
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve(args.into()),
        Command::Check(args) => run_check(args),
        Command::Test(args) => run_test(args),
        Command::Certs(args) => run_certs(args),
        Command::Explain(args) => run_explain(args),
        Command::Compile(args) => run_compile(args),
        Command::Webhooks(args) => {
            let options = WebhookOptions::try_from(args)?;
            print!("{}", webhooks::render_yaml(&options).map_err(anyhow::Error::msg)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema(args) => run_schema(args),
    }
}

/// `allot schema`: prints one schema, or writes every schema file into `--out`.
fn run_schema(args: SchemaArgs) -> anyhow::Result<ExitCode> {
    if let Some(dir) = args.out {
        std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        let tests =
            (schema::kind_file_name(crate::cli::suite::TEST_KIND), schema::render(&crate::cli::suite::schema()));
        for (name, text) in schema::files().into_iter().chain([tests]) {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let schema = match args.kind {
        Some(kind) if kind == crate::cli::suite::TEST_KIND => crate::cli::suite::schema(),
        Some(kind) => schema::kind_schema(&kind)
            .map_err(|e| anyhow::anyhow!("{e}, or {} (test files)", crate::cli::suite::TEST_KIND))?,
        None => schema::combined(),
    };
    print!("{}", schema::render(&schema));
    Ok(ExitCode::SUCCESS)
}

/// `allot serve`: the only command that needs an async runtime, so it builds one here.
fn serve(config: ServeConfig) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(server::run(config))?;
    Ok(ExitCode::SUCCESS)
}

/// Reads a file named on the command line, naming it in the error.
fn read_named(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// `allot check`: exit 0 when every manifest is admitted, 1 when one is denied.
fn run_check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let sources = crate::model::policy::read_sources(&args.policies)?;
    let manifests = check::read_manifests(&args.paths)?;
    // DeviceClasses among the manifests count for their extended resource, as the server's
    // watch of the cluster's makes them count.
    let facts = crate::model::policy::ClusterFacts::from_objects(manifests.iter().map(|m| &m.object));
    let policies = crate::model::policy::compile_with(&sources, &facts)?;
    let labels: Box<dyn NamespaceLabels> = match args.namespaces {
        Some(path) => {
            let text = read_named(&path)?;
            Box::new(namespaces::from_manifests(&path.display().to_string(), &text)?)
        }
        None => Box::new(NoNamespaces),
    };
    // Usage from --state, plus what the run's own manifests take, in order.
    let usage = match args.state {
        Some(path) => {
            StaticUsage::parse(&path.display().to_string(), &read_named(&path)?).map_err(anyhow::Error::msg)?
        }
        None => StaticUsage::default(),
    };
    let engine = Engine::new(&policies, labels.as_ref()).with_quota(&usage);
    let report = check::run(&engine, &manifests);
    let text = match args.output {
        Output::Text if args.paths.is_empty() => format!(
            "{}: {} file(s), {} team(s), {} placement(s), {} rule(s) loaded [policy set {}]; no manifests given\n",
            args.policies.display(),
            policies.files.len(),
            policies.teams.len(),
            policies.placements.len(),
            policies.rules.len(),
            policies.version
        ),
        Output::Text => check::render_text(&report),
        Output::Json => check::render_json(&report),
        Output::Junit => check::render_junit(&report),
        Output::Github => crate::cli::github::render(&report),
    };
    print!("{text}");
    Ok(if report.all_admitted() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `allot test`: exit 0 when every case passes, 1 when one fails.
fn run_test(args: TestArgs) -> anyhow::Result<ExitCode> {
    let suite = suite::load(&args.paths, args.policies.as_deref())?;
    if let Some(kubeconfig) = &args.server {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let report = runtime.block_on(async {
            let (client, _) = crate::cli::explain::live::connect(Some(kubeconfig), None).await?;
            anyhow::Ok(suite.run_on_server(&client).await)
        })?;
        print!("{}", report.render_text());
        return Ok(if report.failed() == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    let report = suite.run();
    print!("{}", report.render_text());
    if let Some(path) = args.junit {
        report.write_junit(&path)?;
    }
    Ok(if report.all_passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `allot explain`'s flags as the request [`crate::cli::explain::live::run`] answers.
impl TryFrom<ExplainArgs> for crate::cli::explain::live::Request {
    type Error = anyhow::Error;

    fn try_from(args: ExplainArgs) -> anyhow::Result<Self> {
        use crate::cli::explain::live::PolicySource;
        let policies = match args.policies {
            Some(dir) => PolicySource::Dir(dir),
            None => PolicySource::configmap(&args.policies_configmap).ok_or_else(|| {
                anyhow::anyhow!("--policies-configmap must be NAMESPACE/NAME, got {:?}", args.policies_configmap)
            })?,
        };
        Ok(crate::cli::explain::live::Request {
            subject: match args.subject {
                ExplainSubject::Pod => crate::cli::explain::Subject::Pod,
                ExplainSubject::Gang => crate::cli::explain::Subject::Gang,
                ExplainSubject::Team => crate::cli::explain::Subject::Team,
            },
            name: args.name,
            namespace: args.namespace,
            kubeconfig: args.kubeconfig,
            context: args.context,
            policies,
            timeout: Duration::from_secs(args.timeout_secs.max(1)),
        })
    }
}

/// `allot explain`: exit 0 with an answer (errors exit 2).
fn run_explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::explain::render;
    let output = args.output;
    let request = crate::cli::explain::live::Request::try_from(args)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = runtime.block_on(crate::cli::explain::live::run(&request))?;
    print!(
        "{}",
        match output {
            ExplainOutput::Text => render::text(&report),
            ExplainOutput::Json => render::json(&report),
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `allot certs`: says which files it wrote and whether it reused the CA.
fn run_certs(args: CertsArgs) -> anyhow::Result<ExitCode> {
    let written = crate::cli::certs::generate(&args.out, &args.dns_names, args.days)?;
    println!(
        "{} CA {}; serving certificate {} and key {} for {}",
        if written.reused_ca { "reused" } else { "created" },
        written.ca_cert.display(),
        written.cert.display(),
        written.key.display(),
        args.dns_names.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}
