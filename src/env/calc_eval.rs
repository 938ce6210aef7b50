//! A safe arithmetic evaluator for the `<calc>` tool: numbers, `+ - * /`,
//! parentheses and unary signs, nothing else (no names, no functions, no
//! exponent), by recursive descent:
//!
//! ```text
//! expr    := term (('+' | '-') term)*
//! term    := unary (('*' | '/') unary)*
//! unary   := ('+' | '-') unary | primary
//! primary := number | '(' expr ')'
//! number  := digits ['.' digits] | '.' digits
//! ```
//!
//! Limits keep a hostile expression cheap and the recursion shallow: at most
//! 200 characters, nesting (parentheses plus unary signs) at most 32 deep,
//! every intermediate value within ±1e15. The Unicode signs `−`, `×`, `÷`
//! that models like to write are read as `-`, `*`, `/`.

/// Longest accepted expression, in characters.
pub const MAX_EXPR_CHARS: usize = 200;
/// Deepest accepted nesting of parentheses and unary signs.
pub const MAX_DEPTH: usize = 32;
/// Largest accepted magnitude of any value.
pub const MAX_ABS: f64 = 1e15;

/// Why an expression was rejected; shown to the model as the observation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    /// Nothing but whitespace to evaluate.
    #[error("empty expression")]
    Empty,
    /// More than [`MAX_EXPR_CHARS`] characters.
    #[error("expression longer than {MAX_EXPR_CHARS} characters")]
    TooLong,
    /// Parentheses and unary signs nested more than [`MAX_DEPTH`] deep.
    #[error("expression nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A character the grammar has no place for here (a letter, a stray `)`, a
    /// missing operator between two numbers).
    #[error("unexpected character {ch:?} at position {pos}")]
    UnexpectedChar {
        /// The character found.
        ch: char,
        /// Its 0-based position in the expression, in characters.
        pos: usize,
    },
    /// The expression stops where an operand or `)` is still needed (`2 +`, `(1`).
    #[error("unexpected end of expression")]
    UnexpectedEnd,
    /// A dot with no digit where a number should be (`.` alone).
    #[error("invalid number at position {pos}")]
    InvalidNumber {
        /// The 0-based position, in characters, where the number starts.
        pos: usize,
    },
    /// A division whose divisor is zero.
    #[error("division by zero")]
    DivisionByZero,
    /// A number or intermediate result whose magnitude exceeds [`MAX_ABS`].
    #[error("value out of range (magnitude above 1e15)")]
    OutOfRange,
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

fn in_range(v: f64) -> Result<f64, CalcError> {
    if v.is_finite() && v.abs() <= MAX_ABS {
        Ok(v)
    } else {
        Err(CalcError::OutOfRange)
    }
}

impl Parser {
    /// The next non-space character, with Unicode signs mapped to ASCII.
    fn peek(&mut self) -> Option<char> {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
        self.chars.get(self.pos).map(|&c| match c {
            '−' => '-',
            '×' => '*',
            '÷' => '/',
            c => c,
        })
    }

    fn enter(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CalcError::TooDeep);
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<f64, CalcError> {
        let mut v = self.term()?;
        loop {
            match self.peek() {
                Some('+') => {
                    self.pos += 1;
                    v = in_range(v + self.term()?)?;
                }
                Some('-') => {
                    self.pos += 1;
                    v = in_range(v - self.term()?)?;
                }
                _ => return Ok(v),
            }
        }
    }

    fn term(&mut self) -> Result<f64, CalcError> {
        let mut v = self.unary()?;
        loop {
            match self.peek() {
                Some('*') => {
                    self.pos += 1;
                    v = in_range(v * self.unary()?)?;
                }
                Some('/') => {
                    self.pos += 1;
                    let d = self.unary()?;
                    if d == 0.0 {
                        return Err(CalcError::DivisionByZero);
                    }
                    v = in_range(v / d)?;
                }
                _ => return Ok(v),
            }
        }
    }

    fn unary(&mut self) -> Result<f64, CalcError> {
        match self.peek() {
            Some(sign @ ('+' | '-')) => {
                self.pos += 1;
                self.enter()?;
                let v = self.unary()?;
                self.depth -= 1;
                Ok(if sign == '-' { -v } else { v })
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<f64, CalcError> {
        match self.peek() {
            None => Err(CalcError::UnexpectedEnd),
            Some('(') => {
                self.pos += 1;
                self.enter()?;
                let v = self.expr()?;
                match self.peek() {
                    Some(')') => self.pos += 1,
                    Some(ch) => return Err(CalcError::UnexpectedChar { ch, pos: self.pos }),
                    None => return Err(CalcError::UnexpectedEnd),
                }
                self.depth -= 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some(ch) => Err(CalcError::UnexpectedChar { ch, pos: self.pos }),
        }
    }

    fn number(&mut self) -> Result<f64, CalcError> {
        let start = self.pos;
        let mut seen_dot = false;
        while let Some(&c) = self.chars.get(self.pos) {
            if c.is_ascii_digit() || (c == '.' && !seen_dot) {
                seen_dot |= c == '.';
                self.pos += 1;
            } else {
                break;
            }
        }
        let literal: String = self.chars[start..self.pos].iter().collect();
        // "." alone has no digit; Rust's parser rejects it, as it should.
        let v = literal
            .parse::<f64>()
            .map_err(|_| CalcError::InvalidNumber { pos: start })?;
        in_range(v)
    }
}

/// Evaluates an arithmetic expression (see the module doc).
pub fn evaluate(expr: &str) -> Result<f64, CalcError> {
    let chars: Vec<char> = expr.chars().collect();
    if chars.len() > MAX_EXPR_CHARS {
        return Err(CalcError::TooLong);
    }
    let mut p = Parser {
        chars,
        pos: 0,
        depth: 0,
    };
    if p.peek().is_none() {
        return Err(CalcError::Empty);
    }
    let v = p.expr()?;
    match p.peek() {
        None => Ok(v),
        Some(ch) => Err(CalcError::UnexpectedChar { ch, pos: p.pos }),
    }
}

/// Formats a result: integers without a decimal point, others with at most
/// ten decimals and no trailing zeros (so `0.1 + 0.2` reads `0.3`).
pub fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() <= MAX_ABS {
        // Exact: integral and within i64.
        return format!("{}", v as i64);
    }
    let s = format!("{v:.10}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// Evaluates and formats: the calculator tool's whole job.
pub fn calculate(expr: &str) -> Result<String, CalcError> {
    evaluate(expr).map(format_number)
}
