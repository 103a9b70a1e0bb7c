//! Text from outside made fit for our logs and errors.

/// Text from outside (a node, cert-manager) made fit for one log line or
/// error: control characters become spaces, and it is cut at `max`
/// characters (marked with `…`).
pub fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}
