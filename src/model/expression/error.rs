//! Why an expression does not compile: each cause its own variant, so callers and metrics can
//! tell them apart, while the message stays the one a policy author reads.

use super::VARIABLES;
use super::depth::{self, Nesting};
use super::panics::ContainedPanic;

/// Why [`super::Expression::compile`] or [`super::ForeignExpression::compile`] refused a source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpressionError {
    /// Nested deeper than cel's parser survives ([`depth::scan`]), refused before parsing.
    #[error("{}", depth::nesting_message(*.0))]
    TooNested(Nesting),
    /// `!!x` or `--x`, which cel 0.13 reads as one operator ([`depth::repeated_unary`]).
    #[error("{}", depth::repeated_unary_message(*operator, *column))]
    RepeatedUnary { operator: char, column: usize },
    /// The parser panicked (contained); the input got past the depth scan.
    #[error("CEL syntax error: the parser failed on this expression ({0})")]
    ParserPanicked(ContainedPanic),
    /// The parser's own error text.
    #[error("CEL syntax error: {0}")]
    Syntax(String),
    /// Constructs the engine cannot evaluate, one message each ([`super::check::unsupported`]).
    #[error("{}", .0.join("; "))]
    Unsupported(Vec<String>),
    /// Identifiers that are none of [`VARIABLES`], sorted and deduplicated.
    #[error("CEL expression uses unknown variable(s) {}; available: {}", .0.join(", "), VARIABLES.join(", "))]
    UnknownVariables(Vec<String>),
    /// The evaluated tree is deeper than [`depth::MAX_TREE_DEPTH`].
    #[error("{}", depth::tree_message(*.0))]
    TooDeep(usize),
}

impl ExpressionError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ExpressionError::TooNested(_) => "too_nested",
            ExpressionError::RepeatedUnary { .. } => "repeated_unary",
            ExpressionError::ParserPanicked(_) => "parser_panicked",
            ExpressionError::Syntax(_) => "syntax",
            ExpressionError::Unsupported(_) => "unsupported",
            ExpressionError::UnknownVariables(_) => "unknown_variables",
            ExpressionError::TooDeep(_) => "too_deep",
        }
    }
}
