//! GBNF text into rules of alternatives ([`RuleDef`]), positions kept for the errors.
//!
//! A rule is `name ::= alternatives`; a rule's body runs until the next `name ::=` or the end of
//! the text, so rules may span lines (as xgrammar reads them) or sit one a line (as llama.cpp
//! writes them). Whitespace and `#` comments may stand between any two items.

use super::GrammarError;

/// Most times a counted repetition (`x{m,n}`) may name.
pub(super) const MAX_COUNT: u32 = 1024;

/// Deepest nesting of parentheses.
const MAX_NESTING: usize = 64;

/// One rule as written.
#[derive(Debug)]
pub(super) struct RuleDef {
    pub name: String,
    /// Where its name stands (a byte offset).
    pub at: usize,
    pub body: Alternatives,
}

/// Alternatives, each a sequence of items (an empty one reads nothing).
#[derive(Debug)]
pub(super) struct Alternatives(pub Vec<Vec<Item>>);

/// An atom and how many times it repeats.
#[derive(Debug)]
pub(super) struct Item {
    pub atom: Atom,
    pub min: u32,
    /// `None`: without bound.
    pub max: Option<u32>,
}

/// What one item reads once.
#[derive(Debug)]
pub(super) enum Atom {
    /// These bytes (a string literal's UTF-8).
    Text(Vec<u8>),
    /// One character of these inclusive code point ranges (the complement's, `negated`).
    Class { negated: bool, ranges: Vec<(u32, u32)> },
    /// Any one character (`.`).
    Any,
    /// Another rule, by name, and where the name stands.
    Ref { name: String, at: usize },
    /// A parenthesised group.
    Group(Alternatives),
}

/// Reads `text` into its rules, in order.
pub(super) fn rules(text: &str) -> Result<Vec<RuleDef>, GrammarError> {
    let mut parser = Parser { text, at: 0, depth: 0 };
    let mut rules = Vec::new();
    parser.space();
    while !parser.at_end() {
        let at = parser.at;
        let Some(name) = parser.name() else {
            return Err(parser.error("expected a rule's name (name ::= ...)"));
        };
        parser.space();
        if !parser.eat("::=") {
            return Err(parser.error(format!("expected ::= after the rule name {name:?}")));
        }
        parser.space();
        let body = parser.alternatives()?;
        rules.push(RuleDef { name, at, body });
    }
    Ok(rules)
}

/// Line and column (from 1, in characters) of byte offset `at` in `text`.
pub(super) fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

struct Parser<'a> {
    text: &'a str,
    /// Byte offset of what comes next.
    at: usize,
    /// Open parentheses.
    depth: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn at_end(&self) -> bool {
        self.at == self.text.len()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, s: &str) -> bool {
        let found = self.rest().starts_with(s);
        if found {
            self.at += s.len();
        }
        found
    }

    fn error(&self, message: impl std::fmt::Display) -> GrammarError {
        self.error_at(self.at, message)
    }

    fn error_at(&self, at: usize, message: impl std::fmt::Display) -> GrammarError {
        let (line, column) = line_column(self.text, at);
        GrammarError(format!("line {line}, column {column}: {message}"))
    }

    /// Skips whitespace and comments.
    fn space(&mut self) {
        loop {
            let rest = self.rest();
            let trimmed = rest.trim_start();
            let skipped = rest.len() - trimmed.len();
            let comment = match trimmed.starts_with('#') {
                true => trimmed.find('\n').unwrap_or(trimmed.len()),
                false => 0,
            };
            self.at += skipped + comment;
            if comment == 0 {
                return;
            }
        }
    }

    /// A rule name: letters, digits, `_` and `-`.
    fn name(&mut self) -> Option<String> {
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(self.rest().len());
        let name = self.rest()[..len].to_owned();
        self.at += len;
        (len > 0).then_some(name)
    }

    /// Whether a rule's definition (`name ::=`) starts here: the current body has ended.
    fn at_definition(&self) -> bool {
        let mut ahead = Parser { text: self.text, at: self.at, depth: 0 };
        ahead.name().is_some() && {
            ahead.space();
            ahead.rest().starts_with("::=")
        }
    }

    fn alternatives(&mut self) -> Result<Alternatives, GrammarError> {
        let mut alternatives = vec![self.sequence()?];
        while self.eat("|") {
            self.space();
            alternatives.push(self.sequence()?);
        }
        Ok(Alternatives(alternatives))
    }

    fn sequence(&mut self) -> Result<Vec<Item>, GrammarError> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || self.at_definition() {
                break;
            }
            let atom = self.atom()?;
            self.space();
            let (min, max) = self.repetition()?;
            self.space();
            items.push(Item { atom, min, max });
        }
        Ok(items)
    }

    fn atom(&mut self) -> Result<Atom, GrammarError> {
        let at = self.at;
        match self.peek() {
            Some('"') => {
                self.bump();
                self.text_literal()
            }
            Some('[') => {
                self.bump();
                self.class()
            }
            Some('.') => {
                self.bump();
                Ok(Atom::Any)
            }
            Some('(') => {
                self.bump();
                if self.depth == MAX_NESTING {
                    return Err(self.error(format!("groups nest deeper than {MAX_NESTING}")));
                }
                self.depth += 1;
                self.space();
                if self.rest().starts_with('=') {
                    return Err(self.error("lookahead assertions (= ...) are not supported"));
                }
                let inner = self.alternatives()?;
                self.depth -= 1;
                match self.bump() {
                    Some(')') => Ok(Atom::Group(inner)),
                    _ => Err(self.error_at(at, "this ( is never closed")),
                }
            }
            _ => match self.name() {
                Some(name) => Ok(Atom::Ref { name, at }),
                None => Err(self.error(format!(
                    "unexpected {}: expected a string, a [class], a rule name or (",
                    self.peek().map_or("end".to_owned(), |c| format!("{c:?}"))
                ))),
            },
        }
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` or nothing: `(min, max)`.
    fn repetition(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        let at = self.at;
        let counts = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.bump();
                self.space();
                let min = self.count()?;
                self.space();
                let max = match self.eat(",") {
                    true => {
                        self.space();
                        match self.peek() {
                            Some('}') => None,
                            _ => Some(self.count()?),
                        }
                    }
                    false => Some(min),
                };
                self.space();
                if !self.eat("}") {
                    return Err(self.error("expected } to close the repetition"));
                }
                if max.is_some_and(|max| max < min) {
                    return Err(self.error_at(at, "the repetition's maximum is below its minimum"));
                }
                return Ok((min, max));
            }
            _ => return Ok((1, Some(1))),
        };
        self.bump();
        Ok(counts)
    }

    fn count(&mut self) -> Result<u32, GrammarError> {
        let len = self.rest().find(|c: char| !c.is_ascii_digit()).unwrap_or(self.rest().len());
        match self.rest()[..len].parse::<u32>() {
            Ok(n) if n <= MAX_COUNT => {
                self.at += len;
                Ok(n)
            }
            Ok(_) | Err(_) if len > 0 => {
                Err(self.error(format!("a repetition counts at most {MAX_COUNT} times")))
            }
            _ => Err(self.error("expected a count")),
        }
    }

    /// A string literal's bytes, after its opening quote.
    fn text_literal(&mut self) -> Result<Atom, GrammarError> {
        let mut bytes = Vec::new();
        loop {
            match self.bump() {
                Some('"') => return Ok(Atom::Text(bytes)),
                Some('\\') => {
                    let c = self.escape()?;
                    bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                Some(c) => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                None => return Err(self.error("a string is never closed")),
            }
        }
    }

    /// A character class's ranges, after its `[`.
    fn class(&mut self) -> Result<Atom, GrammarError> {
        let negated = self.eat("^");
        let mut ranges = Vec::new();
        loop {
            let first = match self.bump() {
                Some(']') => return Ok(Atom::Class { negated, ranges }),
                Some('\\') => self.escape()?,
                Some(c) => c,
                None => return Err(self.error("a [class] is never closed")),
            };
            // A `-` between two characters makes a range; before `]` it is itself.
            let last = match self.rest().starts_with('-') && !self.rest().starts_with("-]") {
                true => {
                    self.bump();
                    match self.bump() {
                        Some('\\') => self.escape()?,
                        Some(c) => c,
                        None => return Err(self.error("a [class] is never closed")),
                    }
                }
                false => first,
            };
            if last < first {
                return Err(self.error(format!("the range {first:?}-{last:?} is reversed")));
            }
            ranges.push((first as u32, last as u32));
        }
    }

    /// The character an escape stands for, after its backslash.
    fn escape(&mut self) -> Result<char, GrammarError> {
        let at = self.at - 1;
        let hex = |p: &mut Self, digits: usize| {
            let code = p.rest().get(..digits).and_then(|h| {
                h.bytes().all(|b| b.is_ascii_hexdigit()).then(|| u32::from_str_radix(h, 16).ok())?
            });
            p.at += digits.min(p.rest().len());
            code.and_then(char::from_u32).ok_or_else(|| {
                p.error_at(at, format!("expected {digits} hex digits of a character"))
            })
        };
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('r') => Ok('\r'),
            Some('t') => Ok('\t'),
            Some('0') => Ok('\0'),
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some(c @ ('\\' | '"' | '\'' | '[' | ']' | '-' | '^' | '/')) => Ok(c),
            Some(c) => Err(self.error_at(at, format!("unknown escape \\{c}"))),
            None => Err(self.error_at(at, "a lone \\ at the end")),
        }
    }
}
