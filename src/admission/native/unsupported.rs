//! Why a piece of policy stays with the webhook: what a ValidatingAdmissionPolicy or
//! MutatingAdmissionPolicy cannot say. The text is the coverage report's (`allot compile`
//! lists it under "webhook only").

/// What the native form of a policy cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("namespace glob {0:?} uses glob syntax beyond * and ?")]
    GlobSyntax(String),
    #[error("a template path crosses two lists or maps")]
    TemplatePath,
    #[error(
        "uses Allot's helper accelerators() on something other than `object`, `object.spec` or a container bound \
         by a macro over a containers list"
    )]
    AcceleratorsArgument,
    #[error(
        "uses Allot's helper {0}() other than indexed by a string literal on `object`, `object.spec` or a container \
         bound over a containers list (CEL cannot build its map of computed keys)"
    )]
    HelperLookup(String),
    #[error("uses the name {0}, reserved for the names the expansion binds")]
    ReservedName(String),
    #[error("a macro variable is named {0}, like an Allot variable")]
    MacroVariable(String),
    #[error("reads oldObject of a Pod template, which the API server does not have")]
    TemplateOldObject,
    #[error("an unterminated string literal")]
    UnterminatedString,
    /// The namespace's team cannot be computed natively, and the policy needs it.
    #[error("the team of a namespace: {0}")]
    Team(Box<Unsupported>),
    /// A Placement's `spec.when`.
    #[error("spec.when {0}")]
    When(Box<Unsupported>),
    #[error("matches every kind (`*`): no finite list of resources to bind")]
    EveryKind,
    /// A workload kind whose Pod templates cannot be listed (`group/kind: why`).
    #[error("template {0}")]
    Template(String),
    #[error("kind {0} is not in Allot's workload table: its resource name is unknown")]
    UnknownKind(String),
}

impl Unsupported {
    /// A short, stable name for the reason (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Unsupported::GlobSyntax(_) => "glob_syntax",
            Unsupported::TemplatePath => "template_path",
            Unsupported::AcceleratorsArgument => "accelerators_argument",
            Unsupported::HelperLookup(_) => "helper_lookup",
            Unsupported::ReservedName(_) => "reserved_name",
            Unsupported::MacroVariable(_) => "macro_variable",
            Unsupported::TemplateOldObject => "template_old_object",
            Unsupported::UnterminatedString => "unterminated_string",
            Unsupported::Team(_) => "team",
            Unsupported::When(_) => "when",
            Unsupported::EveryKind => "every_kind",
            Unsupported::Template(_) => "template",
            Unsupported::UnknownKind(_) => "unknown_kind",
        }
    }
}
