//! The globs of budgets and filters, matched against whole function names or the name
//! before its first ` (`.

/// One element of a glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters.
    Star,
    /// `?`: any one character.
    Any,
    /// `[...]`: one character in (or, with `!` or `^` first, not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// Itself (`\` makes the next character itself: `\*`, `\[`).
    Literal(char),
}

impl Token {
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Star => true,
            Token::Any => true,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
            Token::Literal(l) => *l == c,
        }
    }
}

/// A glob, as the shell's: `*` matches any run of characters, `?` one character, `[xyz]` one of
/// those, `[a-z]` one in the range, `[!xy]` (or `[^xy]`) one not among them, `\` the next
/// character itself; anything else itself. A `[` without its `]` is itself, and a pattern
/// equal to the whole text matches it whatever it holds (a frame name such as `[unknown]
/// (libz.so.1)`, copied from a report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    tokens: Vec<Token>,
}

impl Pattern {
    /// The glob `text`.
    pub fn new(text: &str) -> Pattern {
        let chars: Vec<char> = text.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            tokens.push(match c {
                '*' => Token::Star,
                '?' => Token::Any,
                '\\' if i < chars.len() => {
                    i += 1;
                    Token::Literal(chars[i - 1])
                }
                '[' => match class(&chars[i..]) {
                    Some((token, used)) => {
                        i += used;
                        token
                    }
                    None => Token::Literal('['),
                },
                c => Token::Literal(c),
            });
        }
        Pattern {
            text: text.to_string(),
            tokens,
        }
    }

    /// Whether the glob matches all of `name`, or all of the part before its first ` (`.
    pub fn matches_function(&self, name: &str) -> bool {
        self.matches(name)
            || name
                .split_once(" (")
                .is_some_and(|(head, _)| self.matches(head))
    }

    /// Whether the glob matches all of `text`: the usual matcher that remembers only the last
    /// `*` and how much it swallowed, so it takes at most `len(pattern) * len(text)` steps
    /// (no exponential backtracking).
    pub fn matches(&self, text: &str) -> bool {
        // A name copied as it is matches itself, brackets and all (`[unknown] (libz.so.1)`,
        // `[span GET /servers]`): those are not classes to whoever wrote them.
        if self.text == text {
            return true;
        }
        let (p, t): (&[Token], Vec<char>) = (&self.tokens, text.chars().collect());
        let (mut pi, mut ti) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some(Token::Star) => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(token) if token.matches(t[ti]) => {
                    pi += 1;
                    ti += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        pi = sp + 1;
                        ti = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|t| *t == Token::Star)
    }
}

/// The class after a `[`: its token and the characters it took, `]` included; `None` when no
/// `]` closes it. A `]` right after `[` (or `[!`) is a member, as in the shell.
fn class(chars: &[char]) -> Option<(Token, usize)> {
    let mut i = 0;
    let negated = matches!(chars.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let start = i;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && i > start {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        i += 1;
        match (chars.get(i), chars.get(i + 1)) {
            (Some('-'), Some(&hi)) if hi != ']' => {
                ranges.push((c, hi));
                i += 2;
            }
            _ => ranges.push((c, c)),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}
