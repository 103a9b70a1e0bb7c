//! The tables commands print (`nodes`, `audit`): every cell cleaned for a
//! terminal in this one place, columns as wide as what they hold up to a
//! bound (cut with `…` past it; `wide` lifts the bounds), the last column
//! free or cut to a total width, rows coloured by what they say when the
//! output is a terminal.
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

/// What a row says, as a colour on a terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// Refused, revoked, forged: red.
    Alarm,
    /// Wants attention soon (due, expired, cannot return): yellow.
    Warn,
}

impl Tone {
    fn sgr(self) -> &'static str {
        match self {
            Tone::Alarm => "\x1b[31m",
            Tone::Warn => "\x1b[33m",
        }
    }
}

/// How a table is laid out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    /// Every cell whole, whatever the width.
    pub wide: bool,
    /// The last column cut so that no line is wider than this.
    pub width: Option<usize>,
    /// Rows coloured by their tone.
    pub colour: bool,
}

impl Layout {
    /// For stdout: `wide`, or fit the terminal (or 120 columns off one),
    /// coloured on a terminal.
    pub fn stdout(wide: bool) -> Self {
        Layout {
            wide,
            width: (!wide).then(super::terminal::width),
            colour: super::terminal::colour(false),
        }
    }
}

/// The narrowest the last column is cut to, however wide the others.
const LAST_AT_LEAST: usize = 12;

pub struct Table {
    columns: Vec<Column>,
    rows: Vec<(Vec<String>, Option<Tone>)>,
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
        self.toned(cells, None);
    }

    /// A row with a tone, shown as a colour on a terminal.
    pub fn toned(&mut self, cells: Vec<String>, tone: Option<Tone>) {
        self.rows
            .push((cells.iter().map(|c| clean(c)).collect(), tone));
    }

    /// The table, one line a row after the headers, the last column free.
    pub fn render(&self, wide: bool) -> String {
        self.lay_out(Layout {
            wide,
            ..Layout::default()
        })
    }

    /// The table laid out as `layout` says.
    pub fn lay_out(&self, layout: Layout) -> String {
        let wide = layout.wide;
        let n = self.columns.len();
        let widths: Vec<usize> = (0..n)
            .map(|i| {
                let widest = self
                    .rows
                    .iter()
                    .map(|(r, _)| r.get(i).map_or(0, |c| c.chars().count()))
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
        // What is left of the width for the last column.
        let last_max = layout.width.filter(|_| !wide).map(|w| {
            let before: usize = widths[..n.saturating_sub(1)].iter().map(|w| w + 2).sum();
            w.saturating_sub(before).max(LAST_AT_LEAST)
        });
        let line = |cells: &mut dyn Iterator<Item = &str>, tone: Option<Tone>| {
            let mut out = String::new();
            for (i, cell) in cells.enumerate().take(n) {
                let last = i + 1 == n;
                let cell = match (wide, last, last_max) {
                    (true, _, _) | (false, true, None) => cell.to_string(),
                    (false, true, Some(max)) => cut(cell, max),
                    (false, false, _) => cut(cell, widths[i]),
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
            if let Some(t) = tone.filter(|_| layout.colour) {
                out = format!("{}{out}\x1b[0m", t.sgr());
            }
            out.push('\n');
            out
        };
        let mut out = line(&mut self.columns.iter().map(|c| c.header), None);
        for (r, tone) in &self.rows {
            let empty = String::new();
            out.push_str(&line(
                &mut (0..n).map(|i| r.get(i).unwrap_or(&empty).as_str()),
                *tone,
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

    #[test]
    fn a_width_cuts_the_last_column_and_colour_only_when_asked() {
        let mut t = two();
        t.toned(
            vec!["n1".into(), "REVOKED: stolen laptop".into()],
            Some(Tone::Alarm),
        );
        t.row(vec!["n2".into(), "due in 3d".into()]);
        let fit = Layout {
            width: Some(18),
            ..Layout::default()
        };
        let out = t.lay_out(fit);
        assert!(out.lines().all(|l| l.chars().count() <= 18), "{out}");
        assert!(out.contains("n1    REVOKED: st…"), "{out}");
        assert!(!out.contains('\x1b'), "{out:?}");
        let coloured = t.lay_out(Layout {
            colour: true,
            ..fit
        });
        assert!(
            coloured.contains("\x1b[31mn1    REVOKED: st…\x1b[0m\n"),
            "{coloured:?}"
        );
        assert!(coloured.contains("\nn2    due in 3d\n"), "{coloured:?}");
    }
}
