//! Grammars from requests (vLLM's `guided_grammar` and `structured_outputs.grammar`, SGLang's
//! `sampling_params.ebnf`): GBNF text read where it is given, so that a grammar the engine
//! cannot follow is a 400 naming the field and never reaches the scheduler. Reading one is a
//! single pass over its text (the reader's DFA is built lazily on the scheduler's thread), so
//! nothing is cached here.

use std::sync::Arc;

use routed_types::Grammar;
use serde_json::Value;

use crate::error::ApiError;

/// The grammar a request's field `param` gives: GBNF text whose `root` rule the output follows,
/// else a 400 naming the field with where and why.
pub(crate) fn grammar_of(value: &Value, param: &str) -> Result<Arc<Grammar>, ApiError> {
    let Some(text) = value.as_str() else {
        return Err(ApiError::InvalidRequest {
            message: format!("{param} must be a GBNF grammar (a string), got {value}"),
            param: Some(param.to_owned()),
            code: "invalid_type",
        });
    };
    Grammar::new(text).map(Arc::new).map_err(|e| {
        ApiError::invalid(param, format!("{param} is not a grammar the engine can follow: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grammar_is_read_and_a_bad_one_refused_naming_the_field() {
        let g = grammar_of(&Value::from("root ::= [a-z]+"), "guided_grammar").unwrap();
        assert_eq!(g.as_str(), "root ::= [a-z]+");
        let e = grammar_of(&Value::from("root ::= item"), "guided_grammar").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("guided_grammar") && text.contains("no rule is named item"),
            "{text}"
        );
        let ApiError::InvalidRequest { param, code, .. } = e else { panic!() };
        assert_eq!((param.as_deref(), code), (Some("guided_grammar"), "invalid_value"));
        let e = grammar_of(&Value::from(3), "sampling_params.ebnf").unwrap_err();
        let ApiError::InvalidRequest { param, code, .. } = e else { panic!() };
        assert_eq!((param.as_deref(), code), (Some("sampling_params.ebnf"), "invalid_type"));
    }
}
