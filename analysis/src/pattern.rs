//! The globs of budgets and filters, matched against whole function names or the name
//! before its first ` (`.

/// A glob: `*` matches any run of characters, `?` one character, anything else itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(Vec<char>);

impl Pattern {
    /// The glob `text`.
    pub fn new(text: &str) -> Pattern {
        Pattern(text.chars().collect())
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
        let (p, t): (&[char], Vec<char>) = (&self.0, text.chars().collect());
        let (mut pi, mut ti) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some('*') => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(&c) if c == '?' || c == t[ti] => {
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
        p[pi..].iter().all(|&c| c == '*')
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.iter().collect::<String>())
    }
}
