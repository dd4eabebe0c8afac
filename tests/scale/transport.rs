//! Where the scale test registers the webhooks, which decides whether the API server speaks
//! HTTP/1.1 or HTTP/2 to them.

/// Where the webhooks are registered, which decides how the API server talks to them: HTTP/2
/// (one connection for every concurrent call) to a URL on a loopback address or `localhost`
/// (kubernetes#122558), HTTP/1.1 (a connection per concurrent call, kept alive) to any other
/// host, as to a Service webhook in a cluster (kubernetes#82090, #75791). A name of this machine
/// that resolves to loopback addresses only gets the production transport while staying on
/// loopback; without one (or with `ALLOT_SCALE_TRANSPORT=h2`) the URL is 127.0.0.1.
pub(crate) struct Transport {
    pub(crate) host: String,
    pub(crate) http1: bool,
    pub(crate) why: String,
}

impl Transport {
    pub(crate) fn choose() -> Transport {
        let loopback =
            |host: &str| Transport { host: "127.0.0.1".to_string(), http1: false, why: format!("HTTP/2: {host}") };
        if std::env::var("ALLOT_SCALE_TRANSPORT").is_ok_and(|t| t == "h2") {
            return loopback("a loopback address, as ALLOT_SCALE_TRANSPORT=h2 asks");
        }
        // From /etc/hosts, not the resolver: no DNS query leaves the machine, and the API server
        // (Go's resolver reads the same file first) finds the same address.
        let nsswitch = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
        if !hosts_file_first(&nsswitch) {
            return loopback("a loopback address: /etc/nsswitch.conf asks DNS before /etc/hosts");
        }
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let this_machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        match loopback_only_name(&hosts, &this_machine) {
            Some(name) => Transport {
                why: format!("HTTP/1.1 as to a Service webhook: /etc/hosts maps {name} to 127.0.0.1"),
                host: name,
                http1: true,
            },
            None => loopback("a loopback address: /etc/hosts maps no name but localhost to 127.0.0.1 alone"),
        }
    }

    pub(crate) fn url(&self, port: u16) -> String {
        format!("https://{}:{port}", self.host)
    }

    /// `url` (a server on 127.0.0.1) under this transport's host.
    pub(crate) fn same_host(&self, url: &str) -> String {
        url.replacen("127.0.0.1", &self.host, 1)
    }
}

/// True when host names are looked up in `/etc/hosts` before anything else (`nsswitch`: the
/// text of `/etc/nsswitch.conf`; without a `hosts:` line, resolvers read the file first): a
/// name from it then never waits on a DNS server this machine may not reach.
fn hosts_file_first(nsswitch: &str) -> bool {
    let sources = nsswitch.lines().find_map(|l| l.split('#').next()?.trim().strip_prefix("hosts:"));
    sources.is_none_or(|s| s.split_whitespace().next().is_none_or(|first| first == "files"))
}

#[test]
fn names_are_taken_from_etc_hosts_only_when_it_is_read_first() {
    assert!(hosts_file_first(""), "no nsswitch.conf: files first");
    assert!(hosts_file_first("passwd: files\nhosts:          files dns\n"));
    assert!(hosts_file_first("hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n"));
    assert!(!hosts_file_first("hosts: dns files\n"));
    assert!(!hosts_file_first("# comment\nhosts: myhostname files\n"));
    assert!(hosts_file_first("# hosts: dns\nhosts: files\n"), "a commented line is no setting");
}

/// A name `/etc/hosts` (its text: `hosts`) maps to 127.0.0.1 and nothing else, other than
/// `localhost…` (which the API server treats as loopback): `preferred` when it is one.
fn loopback_only_name(hosts: &str, preferred: &str) -> Option<String> {
    // Names compared without case, as resolvers read the file.
    let mut addresses: std::collections::HashMap<String, Vec<&str>> = std::collections::HashMap::new();
    let mut order = Vec::new();
    for line in hosts.lines() {
        let mut fields = line.split('#').next().unwrap_or_default().split_whitespace();
        let Some(ip) = fields.next() else { continue };
        for name in fields.map(str::to_ascii_lowercase) {
            if !addresses.contains_key(&name) {
                order.push(name.clone());
            }
            addresses.entry(name).or_default().push(ip);
        }
    }
    let usable = |name: &str| {
        !name.starts_with("localhost")
            && !name.ends_with(".localhost")
            && name.parse::<std::net::IpAddr>().is_err()
            && addresses[name].iter().all(|ip| *ip == "127.0.0.1")
    };
    let preferred = preferred.to_ascii_lowercase();
    order.iter().find(|n| **n == preferred && usable(n)).or_else(|| order.iter().find(|n| usable(n))).cloned()
}

#[test]
fn the_webhook_host_is_a_name_for_127_0_0_1_alone() {
    let hosts = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.0.1 runsc # a comment\n127.0.0.1 vm\n\
                 127.0.1.1 debian\n127.0.0.1 both\n::1 both\n# 127.0.0.1 commented\n";
    assert_eq!(loopback_only_name(hosts, "vm").as_deref(), Some("vm"), "the machine's own name first");
    assert_eq!(loopback_only_name(hosts, "debian").as_deref(), Some("runsc"), "127.0.1.1: not where Allot listens");
    assert_eq!(loopback_only_name(hosts, "both").as_deref(), Some("runsc"), "also ::1: a dial might go there");
    assert_eq!(loopback_only_name("127.0.0.1 localhost localhost.localdomain\n", ""), None);
    assert_eq!(loopback_only_name("", "vm"), None);
    assert_eq!(loopback_only_name("127.0.0.1 commented\n", "x").as_deref(), Some("commented"));
    assert_eq!(loopback_only_name("# 127.0.0.1 commented\n", "x"), None);
    assert_eq!(loopback_only_name("127.0.0.1 VM\n::1 vm\n", "vm"), None, "one name, whatever its case");
    assert_eq!(loopback_only_name("127.0.0.1 Box\n", "box").as_deref(), Some("box"));
    assert_eq!(loopback_only_name("127.0.0.1 app.localhost\n", ""), None, "*.localhost is loopback to resolvers");
}
