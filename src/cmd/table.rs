//! The tables commands print (`nodes`, `audit`): every cell cleaned for a
//! terminal in this one place, columns as wide as what they hold up to a
//! bound (cut with `…` past it; `wide` lifts the bounds), the last column
//! free.
//!
//! Much of what a table shows was written by someone else (a forged audit
//! event, a record in the bucket, a node's name): a control character or
//! a bidirectional override there could move the cursor, recolour the
//! terminal, or draw over another row, so each becomes `?`.

/// One column: its header and, unless `wide`, the most characters it shows.
pub struct Column {
    pub header: &'static str,
    pub max: usize,
}

pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: Vec<Column>) -> Self {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// A row of cells, one per column (missing ones are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    /// The table, one line a row after the headers.
    pub fn render(&self, wide: bool) -> String {
        let n = self.columns.len();
        let widths: Vec<usize> = (0..n)
            .map(|i| {
                let widest = self
                    .rows
                    .iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .chain([self.columns[i].header.len()])
                    .max()
                    .unwrap_or(0);
                if wide {
                    widest
                } else {
                    widest.min(self.columns[i].max)
                }
            })
            .collect();
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::new();
            for (i, cell) in cells.enumerate().take(n) {
                let last = i + 1 == n;
                let cell = if wide || last {
                    cell.to_string()
                } else {
                    cut(cell, widths[i])
                };
                if last {
                    out.push_str(&cell);
                } else {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    out.push_str(&cell);
                    out.push_str(&" ".repeat(pad + 2));
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            out
        };
        let mut out = line(&mut self.columns.iter().map(|c| c.header));
        for r in &self.rows {
            let empty = String::new();
            out.push_str(&line(
                &mut (0..n).map(|i| r.get(i).unwrap_or(&empty).as_str()),
            ));
        }
        out
    }
}

/// `text` fit for one cell of a terminal: control characters, and the
/// format characters that reorder or hide text, become `?`.
pub fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            let reorders = matches!(
                c,
                '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}'
            );
            if c.is_control() || reorders {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// At most `max` characters, the last of them `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Table {
        Table::new(vec![
            Column {
                header: "NODE",
                max: 10,
            },
            Column {
                header: "STATE",
                max: 5,
            },
        ])
    }

    #[test]
    fn nothing_someone_else_wrote_reaches_the_terminal_as_a_control() {
        let mut t = two();
        t.row(vec![
            "evil\u{1b}[2K\u{1b}[1A".into(),
            "ok\r\u{202e}gnp.exe\u{7}".into(),
        ]);
        let out = t.render(true);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(!out.contains('\u{202e}'), "{out:?}");
        assert!(out.contains("evil?[2K?[1A"), "{out:?}");
    }

    #[test]
    fn columns_are_as_wide_as_they_hold_up_to_their_bound_unless_wide() {
        let mut t = two();
        t.row(vec!["n1".into(), "due in 3d".into()]);
        t.row(vec!["a-much-longer-name".into(), "-".into()]);
        let narrow = t.render(false);
        assert_eq!(
            narrow,
            "NODE        STATE\nn1          due in 3d\na-much-lo…  -\n"
        );
        let wide = t.render(true);
        assert!(wide.contains("a-much-longer-name  -"), "{wide}");
    }
}
