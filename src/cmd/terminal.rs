//! What the commands ask of the terminal they print to: whether there is
//! one, how wide it is, and whether it takes colour. Output that goes to a
//! file or a pipe gets no colour and no rewritten lines.

use std::io::IsTerminal;

/// The width tables fit when the output is not a terminal, or its width
/// is unknown: what the book promises every table fits.
pub const DEFAULT_WIDTH: usize = 120;

/// Whether `stream` is a terminal: stdout (1) or stderr (2).
pub fn is_terminal(stderr: bool) -> bool {
    if stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    }
}

/// The columns of the terminal on stdout: its own size, else `COLUMNS`,
/// else [`DEFAULT_WIDTH`]; never fewer than 60.
pub fn width() -> usize {
    let own = if is_terminal(false) {
        window_columns()
    } else {
        None
    };
    own.or_else(|| std::env::var("COLUMNS").ok()?.trim().parse().ok())
        .unwrap_or(DEFAULT_WIDTH)
        .max(60)
}

/// The terminal's columns, asked of the terminal itself.
fn window_columns() -> Option<usize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given,
    // which lives for the call.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// Whether to colour what goes to stdout (or stderr): a terminal, and
/// neither `NO_COLOR` (<https://no-color.org>) nor `TERM=dumb`.
pub fn colour(stderr: bool) -> bool {
    is_terminal(stderr)
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::env::var("TERM").map_or(true, |t| t != "dumb")
}
