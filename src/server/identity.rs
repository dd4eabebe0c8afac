//! Who Allot is: the user name the API server puts in the AdmissionReviews of Allot's own writes
//! (the gang controller's and the quota queue's gate lifts). The validating webhook lets only
//! that name move Allot's gates and reserved keys, so it must be the name this process writes
//! under, and nothing but the API server knows it for sure: a kustomize overlay that moves the
//! install to another namespace, a renamed ServiceAccount, or a trial run outside the cluster
//! with an admin kubeconfig all change it. So `allot serve` asks at start
//! (`SelfSubjectReview`, authentication.k8s.io/v1, GA since Kubernetes 1.28, which every
//! authenticated user may create).
//!
//! [`decide`] is the start-up decision, pure and tested without a cluster; [`resolve`] asks and
//! logs.

use std::time::Duration;

/// What the API server said about this process's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The user name the API server authenticates this process as.
    Username(String),
    /// No Kubernetes API (no kubeconfig, no in-cluster config, or `--no-kube`).
    NoApi,
    /// The API server will not say (an API server older than 1.28, RBAC that takes
    /// `selfsubjectreviews` away, no user in the answer): why.
    Refused(String),
    /// The API server did not answer in time, or failed (a timeout, a 5xx): why. Asking again
    /// later may work, so Allot does not guess.
    Failed(String),
}

/// Where the identity in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Asked of the API server at start.
    ApiServer,
    /// `--allot-username` (or `$ALLOT_USERNAME`), where the API server could not be asked.
    Flag,
    /// [`crate::admission::tenant::DEFAULT_ALLOT_USERNAME`]: neither could be had.
    Default,
}

impl Source {
    /// The value of the `source` label of `allot_identity_info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::ApiServer => "api-server",
            Source::Flag => "flag",
            Source::Default => "default",
        }
    }
}

/// The identity in force: the only user whose Pod UPDATEs may move Allot's gates and keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub source: Source,
}

/// Why `allot serve` will not start with the identity it was given.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "--allot-username is {flag:?}, but the API server authenticates this process as {reported:?}: \
         Allot's own validating webhook would refuse every gate lift it makes. Leave the flag out (Allot \
         asks the API server who it is), or run Allot with the credentials of {flag:?}"
    )]
    Mismatch { flag: String, reported: String },
    #[error(
        "cannot ask the API server who Allot is ({why}); starting with a guessed identity would let \
         Allot's webhook refuse its own gate lifts, so it stops here and its restart asks again (or \
         set --allot-username)"
    )]
    Unreachable { why: String },
}

impl IdentityError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            IdentityError::Mismatch { .. } => "mismatch",
            IdentityError::Unreachable { .. } => "unreachable",
        }
    }
}

/// The start-up decision. The API server's answer wins; a flag that contradicts it is refused
/// (a webhook that allows one name while the controller writes as another deadlocks every
/// gang); the flag stands only where the API server cannot be asked, and the default only where
/// there is neither.
pub fn decide(reported: &Reported, flag: Option<&str>) -> Result<Identity, IdentityError> {
    let flag = flag.map(str::trim).filter(|f| !f.is_empty());
    match (reported, flag) {
        (Reported::Username(reported), Some(flag)) if reported != flag => {
            Err(IdentityError::Mismatch { flag: flag.to_string(), reported: reported.clone() })
        }
        (Reported::Username(reported), _) => Ok(Identity { username: reported.clone(), source: Source::ApiServer }),
        (Reported::NoApi | Reported::Refused(_) | Reported::Failed(_), Some(flag)) => {
            Ok(Identity { username: flag.to_string(), source: Source::Flag })
        }
        (Reported::Failed(why), None) => Err(IdentityError::Unreachable { why: why.clone() }),
        (Reported::NoApi | Reported::Refused(_), None) => Ok(Identity {
            username: crate::admission::tenant::DEFAULT_ALLOT_USERNAME.to_string(),
            source: Source::Default,
        }),
    }
}

/// How often, and how long each time, the API server is asked before Allot starts without its
/// answer (a slow API server must not keep the webhooks from serving for long).
const ATTEMPTS: u32 = 3;
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the API server who this client is.
pub async fn ask(client: &kube::Client) -> Reported {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let mut why = String::new();
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, api.create(&Default::default(), &SelfSubjectReview::default()))
            .await
        {
            Ok(Ok(review)) => {
                let username = review.status.and_then(|s| s.user_info).and_then(|u| u.username);
                match username.filter(|u| !u.is_empty()) {
                    Some(username) => return Reported::Username(username),
                    None => return Reported::Refused("the SelfSubjectReview names no user".into()),
                }
            }
            // Refused for good: asking again changes nothing.
            Ok(Err(kube::Error::Api(e))) if matches!(e.code, 401 | 403 | 404) => {
                return Reported::Refused(format!("SelfSubjectReview refused: {e}"));
            }
            Ok(Err(e)) => why = format!("SelfSubjectReview failed: {e}"),
            Err(_) => why = format!("SelfSubjectReview timed out after {}s", ATTEMPT_TIMEOUT.as_secs()),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
        }
    }
    Reported::Failed(why)
}

/// Asks (where there is an API), decides, and says in the log what is in force and why.
pub async fn resolve(client: Option<&kube::Client>, flag: Option<&str>) -> Result<Identity, IdentityError> {
    let reported = match client {
        Some(client) => ask(client).await,
        None => Reported::NoApi,
    };
    let identity = decide(&reported, flag)?;
    match (&reported, identity.source) {
        (_, Source::ApiServer) => {
            tracing::info!(username = %identity.username, "Allot's identity, as the API server reports it")
        }
        (Reported::Refused(why) | Reported::Failed(why), source) => tracing::warn!(
            username = %identity.username,
            source = source.as_str(),
            error = %why,
            "the API server could not say who Allot is: only this user may lift Allot's gates; if Allot writes as another, every gang stays gated (alert AllotGateLiftsRefused)"
        ),
        (_, source) => tracing::warn!(
            username = %identity.username,
            source = source.as_str(),
            "no Kubernetes API: only this user may lift Allot's gates (set --allot-username to the identity the gang controller writes as)"
        ),
    }
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::tenant::DEFAULT_ALLOT_USERNAME;

    #[test]
    fn the_api_servers_answer_is_the_identity() {
        let reported = Reported::Username("admin".into());
        assert_eq!(decide(&reported, None).unwrap(), Identity { username: "admin".into(), source: Source::ApiServer });
    }

    #[test]
    fn a_flag_that_agrees_with_the_api_server_is_accepted() {
        let reported = Reported::Username("system:serviceaccount:platform:gpu-allot".into());
        let identity = decide(&reported, Some("system:serviceaccount:platform:gpu-allot")).unwrap();
        assert_eq!(identity.username, "system:serviceaccount:platform:gpu-allot");
        assert_eq!(identity.source, Source::ApiServer);
    }

    #[test]
    fn a_flag_that_contradicts_the_api_server_is_refused_naming_both() {
        let reported = Reported::Username("admin".into());
        let err = decide(&reported, Some(DEFAULT_ALLOT_USERNAME)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("\"admin\"") && text.contains(DEFAULT_ALLOT_USERNAME), "{text}");
        assert_eq!(err.metric_label(), "mismatch");
    }

    #[test]
    fn an_api_server_that_does_not_answer_stops_allot_unless_a_flag_says() {
        let failed = Reported::Failed("SelfSubjectReview timed out after 5s".into());
        let err = decide(&failed, None).unwrap_err();
        assert_eq!(err.metric_label(), "unreachable");
        assert!(err.to_string().contains("timed out"), "{err}");
        assert_eq!(decide(&failed, Some("ops:allot")).unwrap().source, Source::Flag);
    }

    #[test]
    fn without_api_access_the_flag_stands_else_the_default() {
        for reported in [Reported::NoApi, Reported::Refused("404 the server could not find the resource".into())] {
            let flagged = decide(&reported, Some("ops:allot")).unwrap();
            assert_eq!(flagged, Identity { username: "ops:allot".into(), source: Source::Flag });
            let default = decide(&reported, None).unwrap();
            assert_eq!(default, Identity { username: DEFAULT_ALLOT_USERNAME.into(), source: Source::Default });
        }
    }

    #[test]
    fn an_empty_flag_is_no_flag() {
        let reported = Reported::Username("admin".into());
        assert_eq!(decide(&reported, Some("  ")).unwrap().username, "admin");
        assert_eq!(decide(&Reported::NoApi, Some("")).unwrap().source, Source::Default);
    }
}
