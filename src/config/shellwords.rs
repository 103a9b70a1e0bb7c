//! Shell-style splitting of the `helper` command line, with the POSIX quoting
//! rules the Go provisioner's splitter (`kballard/go-shellquote`) follows:
//! blanks separate words, `'…'` is literal, inside `"…"` a backslash only
//! escapes `$`, `` ` ``, `"`, `\` and newline, elsewhere it escapes any
//! character, and backslash-newline is a line continuation. No expansion of
//! variables, globs or `~` happens.

/// Splits `line` into words, or explains why it cannot.
pub fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(next) => {
                    word.push(next);
                    in_word = true;
                }
                None => return Err("the command line ends with an unfinished \\ escape".into()),
            },
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => word.push(ch),
                        None => return Err("a single quote (') is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('\n') => {}
                            Some(ch @ ('$' | '`' | '"' | '\\')) => word.push(ch),
                            Some(ch) => {
                                word.push('\\');
                                word.push(ch);
                            }
                            None => return Err("a double quote (\") is not closed".into()),
                        },
                        Some(ch) => word.push(ch),
                        None => return Err("a double quote (\") is not closed".into()),
                    }
                }
            }
            other => {
                word.push(other);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::split;

    fn ok(s: &str) -> Vec<String> {
        split(s).unwrap()
    }

    #[test]
    fn words_and_quotes() {
        assert_eq!(ok("/usr/bin/helper"), ["/usr/bin/helper"]);
        assert_eq!(ok("  a   b\tc\n"), ["a", "b", "c"]);
        assert_eq!(ok("ruby '/opt/my helper.rb' --x"), ["ruby", "/opt/my helper.rb", "--x"]);
        assert_eq!(ok(r#"a "b \"c\" \d $" e"#), ["a", r#"b "c" \d $"#, "e"]);
        assert_eq!(ok(r"a\ b c"), ["a b", "c"]);
        assert_eq!(ok("x''y \"\""), ["xy", ""]);
        assert_eq!(ok("a \\\nb"), ["a", "b"]);
        assert!(ok("").is_empty());
        assert!(ok("   ").is_empty());
    }

    #[test]
    fn unterminated() {
        assert!(split("a 'b").is_err());
        assert!(split("a \"b").is_err());
        assert!(split("a \\").is_err());
    }
}
