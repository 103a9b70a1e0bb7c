//! The book (`docs/`): its reference pages are made from the code, and every
//! example file it shows is loaded with the project's own parsers.
//!
//! ```text
//! cargo test --test it book::                      fails, with a diff, when a page differs
//! UPDATE_REFERENCE=1 cargo test --test it book::   rewrites docs/src/reference/*.md
//! scripts/docs.sh --update                    the same, then builds the book
//! ```
//!
//! The pages and where they come from:
//!
//! * `configuration.md`: `config::schema` (every key, its type and doc
//!   comment) and the parser's effective settings for files that set nothing
//!   (the defaults `run --check` prints);
//! * `provisioner-crd.md`: what `choria-provisioner crd` prints (the CRD's
//!   OpenAPI schema with its descriptions);
//! * `cli.md`: the clap command tree;
//! * `metrics.md`: the provisioner's and the operator's registries.

mod crd;
mod render;

use choria_config::schema::{
    AdmissionFile, AuditFile, CaFile, CertManagerFile, ConfigurationTemplateFile, ElectionFile,
    EvidenceFile, FeaturesFile, Field, ProvisionerFile, RecordsFile, RenewalFile, TelemetryFile,
};
use choria_config::{parse_duration, ProvisionerConfig};
use choria_core::monitor::Exposition;
use choria_provisioner::cmd::Cli;
use clap::CommandFactory;
use render::{cell, code, diff, generated_notice, one_line};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn reference_dir() -> PathBuf {
    repo().join("docs/src/reference")
}

/// Writes `page` under `UPDATE_REFERENCE=1`, otherwise fails with a diff when
/// the file differs.
fn check_page(name: &str, page: &str) {
    let path = reference_dir().join(name);
    if std::env::var_os("UPDATE_REFERENCE").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(reference_dir()).unwrap();
        std::fs::write(&path, page).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != page {
        panic!(
            "docs/src/reference/{name} differs from what the code produces \
             (- on disk, + from the code):\n{}\n\
             Regenerate it: UPDATE_REFERENCE=1 cargo test --test it book:: (or scripts/docs.sh --update), \
             then read the diff and commit it.",
            diff(&on_disk, page)
        );
    }
}

// ---------------------------------------------------------------------------
// provisioner.yaml

/// The sections of `provisioner.yaml` by their schema type.
fn section(ty: &str) -> Option<&'static [Field]> {
    Some(match ty {
        "FeaturesFile" => FeaturesFile::FIELDS,
        "ElectionFile" => ElectionFile::FIELDS,
        "ConfigurationTemplateFile" => ConfigurationTemplateFile::FIELDS,
        "CertManagerFile" => CertManagerFile::FIELDS,
        "CaFile" => CaFile::FIELDS,
        "RecordsFile" => RecordsFile::FIELDS,
        "RenewalFile" => RenewalFile::FIELDS,
        "AdmissionFile" => AdmissionFile::FIELDS,
        "AuditFile" => AuditFile::FIELDS,
        "EvidenceFile" => EvidenceFile::FIELDS,
        "TelemetryFile" => TelemetryFile::FIELDS,
        _ => return None,
    })
}

/// The settings the parser reports for files that set nothing but what it
/// requires, one per election backend (each reports its backend's keys).
fn effective_defaults() -> BTreeMap<String, String> {
    let base = "configuration_template:\n  configuration:\n    identity: \"{{ identity }}\"\n";
    let mut out = BTreeMap::new();
    for extra in [
        "",
        "election:\n  backend: streams\n",
        "election:\n  backend: lease\n",
    ] {
        let text = format!("{base}{extra}");
        let cfg = ProvisionerConfig::parse(&text, "defaults.yaml")
            .unwrap_or_else(|e| panic!("the defaults file does not parse: {e}\n{text}"));
        for (key, value) in cfg.effective_settings() {
            out.entry(key).or_insert(value);
        }
    }
    out
}

fn yaml_type(ty: &str) -> &'static str {
    match ty {
        "i64" => "integer",
        "String" => "string",
        "bool" => "boolean",
        "Vec<String>" => "list of strings",
        "BTreeMap<String, String>" => "map of strings",
        "BTreeMap<String, serde_json::Value>" => "mapping",
        "serde_json::Value" => "mapping",
        t if section(t).is_some() => "section",
        t => panic!("tests/it/book.rs does not know the schema type {t:?}: add it to yaml_type()"),
    }
}

/// A doc comment's meaning and its `Default:` paragraph, if any.
fn split_doc(doc: &str) -> (String, Option<String>) {
    let mut paragraphs: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in doc.lines().map(str::trim) {
        if line.is_empty() {
            if !current.is_empty() {
                paragraphs.push(std::mem::take(&mut current));
            }
        } else {
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(line);
        }
    }
    if !current.is_empty() {
        paragraphs.push(current);
    }
    let default = paragraphs
        .last()
        .and_then(|p| p.strip_prefix("Default:"))
        .map(|d| d.trim().to_string());
    if default.is_some() {
        paragraphs.pop();
    }
    (paragraphs.join(" "), default)
}

/// How the parser's effective value reads in the Default column.
fn shown_default(key: &str, value: &str) -> String {
    if key == "workers" {
        // The machine's CPU count: the same on every machine only in words.
        return "one per CPU".into();
    }
    if value.is_empty() {
        return "—".into();
    }
    if let Some(words) = value.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
        return format!("*{words}*");
    }
    if key == "cert_deny_list" {
        return value.split(' ').map(code).collect::<Vec<_>>().join(" ");
    }
    code(value)
}

fn configuration_page() -> String {
    let effective = effective_defaults();
    let mut p = String::new();
    p.push_str("# `provisioner.yaml`\n\n");
    p.push_str(&generated_notice(
        "`crates/config/src/schema.rs` (every key, its type and doc comment) and the parser's effective \
         settings for a file that sets nothing (the defaults `run --check` prints)",
    ));
    p.push_str(
        "Keys and defaults are the Go provisioner's, plus ours (their meaning starts with “Ours”). Keys match \
         case-insensitively, the last duplicate wins, `null` keeps the default, and unknown keys \
         are reported as warnings with a suggestion. Durations are Choria durations: `500ms`, \
         `10s`, `1m`, `1h`, `1d`, `1w`, `1y`. Every error names the file, the line and the key.\n\n\
         `choria-provisioner run --check --config provisioner.yaml` prints every setting as it \
         takes effect, secrets redacted.\n",
    );
    let mut sections: Vec<(String, &'static [Field])> =
        vec![(String::new(), ProvisionerFile::FIELDS)];
    let mut i = 0;
    while i < sections.len() {
        let (prefix, fields) = sections[i].clone();
        p.push_str(&if prefix.is_empty() {
            "\n## The top level\n\n".to_string()
        } else {
            format!("\n## `{}`\n\n", prefix.trim_end_matches('.'))
        });
        p.push_str("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
        for f in fields {
            let key = format!("{prefix}{}", f.key);
            let ty = yaml_type(f.ty);
            let (meaning, doc_default) = split_doc(f.doc);
            assert!(
                !meaning.is_empty(),
                "the key {key} has no doc comment in crates/config/src/schema.rs: say what it means \
                 there (the book's reference is made from it)"
            );
            let parsed_default = effective.get(&key).filter(|_| ty != "section");
            let default = match (parsed_default, doc_default) {
                (Some(_), Some(_)) => panic!(
                    "{key}: its doc comment in crates/config/src/schema.rs states a default, and the \
                     parser reports one too: remove the doc's `Default:` paragraph"
                ),
                (Some(v), None) => shown_default(&key, v),
                (None, Some(d)) => d,
                (None, None) if ty == "section" => format!("[below](#{key})"),
                (None, None) => "—".into(),
            };
            // A string whose default is a duration is one.
            let bare = default.trim_matches('`');
            let ty = if ty == "string" && !bare.is_empty() && parse_duration(bare).is_ok() {
                "duration"
            } else {
                ty
            };
            // A section's heading below carries the anchor.
            let anchor = if ty == "section" {
                String::new()
            } else {
                format!("<a id=\"{key}\"></a>")
            };
            writeln!(
                p,
                "| {anchor}`{key}` | {ty} | {} | {} |",
                cell(&default),
                cell(&meaning)
            )
            .unwrap();
            if let Some(nested) = section(f.ty) {
                sections.push((format!("{key}."), nested));
            }
        }
        i += 1;
    }
    p
}

#[test]
fn the_configuration_reference_is_current() {
    check_page("configuration.md", &configuration_page());
}

// ---------------------------------------------------------------------------
// The command line

fn cli_page() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let mut p = String::new();
    p.push_str("# Command line\n\n");
    p.push_str(&generated_notice(
        "the clap definitions in `src/cmd/` (`choria-provisioner <command> --help` prints the same)",
    ));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        writeln!(p, "{}\n", about).unwrap();
    }
    p.push_str("```text\nchoria-provisioner [OPTIONS] [COMMAND]\n```\n\n");
    p.push_str("Every command also takes `-h`/`--help`; `choria-provisioner --version` prints the version.\n\n");
    p.push_str("## Options of every command\n\nAccepted before or after the command's name.\n\n");
    let globals: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set() && !is_builtin(a))
        .collect();
    args_table(&mut p, globals.into_iter());
    p.push_str("\n## Commands\n\n| Command | What it does |\n|---|---|\n");
    let subcommands: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    for sub in &subcommands {
        writeln!(
            p,
            "| [`{}`](#{}) | {} |",
            sub.get_name(),
            sub.get_name(),
            cell(&sentence(
                &sub.get_about().map(|a| a.to_string()).unwrap_or_default()
            ))
        )
        .unwrap();
    }
    for sub in subcommands {
        writeln!(p, "\n## `{}`\n", sub.get_name()).unwrap();
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        writeln!(p, "{}\n", sentence(about.trim())).unwrap();
        let usage = sub.clone().render_usage().to_string();
        let usage = usage.trim().trim_start_matches("Usage:").trim();
        writeln!(p, "```text\n{usage}\n```\n").unwrap();
        let args: Vec<&clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.is_global_set() && !a.is_hide_set() && !is_builtin(a))
            .collect();
        if args.is_empty() {
            p.push_str("No options of its own.\n");
        } else {
            args_table(&mut p, args.into_iter());
        }
    }
    p
}

/// clap drops the doc comment's closing period; the page puts it back.
fn sentence(text: &str) -> String {
    let text = text.trim();
    if text.is_empty() || text.ends_with(['.', '!', '?']) {
        text.to_string()
    } else {
        format!("{text}.")
    }
}

fn is_builtin(a: &clap::Arg) -> bool {
    matches!(a.get_id().as_str(), "help" | "version")
}

fn args_table<'a>(p: &mut String, args: impl Iterator<Item = &'a clap::Arg>) {
    p.push_str("| Option | Default | Environment | Meaning |\n|---|---|---|---|\n");
    for a in args {
        let takes_value = a.get_action().takes_values();
        let value = a
            .get_value_names()
            .map(|names| {
                names
                    .iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()));
        let mut flag = match (a.get_long(), a.get_short()) {
            (Some(l), Some(s)) => format!("-{s}, --{l}"),
            (Some(l), None) => format!("--{l}"),
            (None, Some(s)) => format!("-{s}"),
            (None, None) => String::new(),
        };
        if takes_value {
            if flag.is_empty() {
                flag = value;
            } else {
                flag = format!("{flag} {value}");
            }
        }
        let defaults: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let is_flag = matches!(
            a.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse | clap::ArgAction::Count
        );
        let default = if defaults.is_empty() || is_flag {
            "—".to_string()
        } else if defaults.iter().all(String::is_empty) {
            "*empty*".to_string()
        } else {
            defaults
                .iter()
                .map(|d| code(d))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let env = a
            .get_env()
            .map(|e| code(&e.to_string_lossy()))
            .unwrap_or_else(|| "—".into());
        let mut help = sentence(
            &a.get_long_help()
                .or(a.get_help())
                .map(|h| one_line(&h.to_string()))
                .unwrap_or_default(),
        );
        let possible: Vec<String> = if takes_value {
            a.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| code(v.get_name()))
                .collect()
        } else {
            Vec::new()
        };
        if !possible.is_empty() {
            write!(help, " One of {}.", possible.join(", ")).unwrap();
        }
        if a.is_required_set() {
            help.push_str(" Required.");
        }
        writeln!(
            p,
            "| `{}` | {} | {} | {} |",
            flag,
            cell(&default),
            env,
            cell(help.trim())
        )
        .unwrap();
    }
}

/// The command tables written by hand (the README's, the
/// introduction's) name every command the CLI has, and none it lacks.
#[test]
fn the_command_tables_name_every_command() {
    let cmd = Cli::command();
    let commands: std::collections::BTreeSet<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name().to_string())
        .collect();
    for page in ["README.md", "docs/src/introduction.md"] {
        let text = std::fs::read_to_string(repo().join(page)).unwrap();
        let table = text
            .split("| Command |")
            .nth(1)
            .unwrap_or_else(|| panic!("{page}: no command table"));
        // The table's first column: `a`, `b` in each row, to the blank line.
        let named: std::collections::BTreeSet<String> = table
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .flat_map(|l| {
                let first = l.split('|').nth(1).unwrap_or_default().to_string();
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(named, commands, "{page}: its command table");
    }
}

#[test]
fn the_command_line_reference_is_current() {
    check_page("cli.md", &cli_page());
}

// ---------------------------------------------------------------------------
// Metrics

struct Family {
    name: String,
    kind: &'static str,
    help: String,
    /// Label name → the values its series are created with at start.
    labels: BTreeMap<String, BTreeSet<String>>,
    /// Created at start (with every label set listed), or only when first
    /// counted.
    at_start: bool,
}

fn families(
    registry: &prometheus::Registry,
    later: &[prometheus::proto::MetricFamily],
) -> Vec<Family> {
    use prometheus::proto::MetricType;
    let at_start: BTreeSet<String> = registry
        .gather()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    let mut out: Vec<Family> = later
        .iter()
        .map(|f| {
            let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for m in f.get_metric() {
                for l in m.get_label() {
                    labels
                        .entry(l.name().to_string())
                        .or_default()
                        .insert(l.value().to_string());
                }
            }
            Family {
                name: f.name().to_string(),
                kind: match f.get_field_type() {
                    MetricType::COUNTER => "counter",
                    MetricType::GAUGE => "gauge",
                    MetricType::SUMMARY => "summary",
                    MetricType::HISTOGRAM => "histogram",
                    MetricType::UNTYPED => "untyped",
                },
                help: f.help().to_string(),
                labels,
                at_start: at_start.contains(f.name()),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn metrics_table(p: &mut String, families: &[&Family], constant: &[&str]) {
    p.push_str("| Metric | Type | Labels | Help |\n|---|---|---|---|\n");
    for f in families {
        let mut labels = Vec::new();
        for (name, values) in &f.labels {
            if constant.contains(&name.as_str()) {
                labels.push(code(name));
            } else if f.at_start {
                labels.push(format!(
                    "{}: {}",
                    code(name),
                    values
                        .iter()
                        .map(|v| code(v))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            } else {
                labels.push(format!("{} (its values appear as they occur)", code(name)));
            }
        }
        let mut help = f.help.clone();
        if !f.at_start {
            help.push_str(" (exported from its first observation)");
        }
        writeln!(
            p,
            "| <a id=\"{}\"></a>`{}` | {} | {} | {} |",
            f.name,
            f.name,
            f.kind,
            if labels.is_empty() {
                "—".into()
            } else {
                cell(&labels.join("; "))
            },
            cell(&help)
        )
        .unwrap();
    }
}

fn metrics_page() -> String {
    let provisioner = choria_core::provision::metrics::Metrics::new("SITE");
    let provisioner = families(provisioner.registry(), &provisioner.registry().gather());
    let operator = choria_operator::metrics::Metrics::new();
    let before = operator.registry().gather();
    // Counted by label values that occur at run time: one observation
    // makes the family and its label names visible.
    operator.failed("an error");
    let after = operator.registry().gather();
    let operator = {
        let mut fams = families(operator.registry(), &after);
        let initial: BTreeSet<&str> = before.iter().map(|f| f.name()).collect();
        for f in &mut fams {
            f.at_start = initial.contains(f.name.as_str());
        }
        fams
    };
    let operator_names: BTreeSet<&str> = operator.iter().map(|f| f.name.as_str()).collect();
    let provisioner_names: BTreeSet<&str> = provisioner.iter().map(|f| f.name.as_str()).collect();
    let shared: Vec<&Family> = provisioner
        .iter()
        .filter(|f| operator_names.contains(f.name.as_str()))
        .collect();
    let own_provisioner: Vec<&Family> = provisioner
        .iter()
        .filter(|f| !operator_names.contains(f.name.as_str()))
        .collect();
    let own_operator: Vec<&Family> = operator
        .iter()
        .filter(|f| !provisioner_names.contains(f.name.as_str()))
        .collect();

    let mut p = String::new();
    p.push_str("# Metrics\n\n");
    p.push_str(&generated_notice(
        "the registries themselves: `provision::metrics::Metrics::new()` (what `run` serves on \
         `monitor_port`) and `operator::metrics::Metrics::new()` (what `operator` serves on \
         `--metrics-port`)",
    ));
    p.push_str(
        "Both serve `/metrics` (Prometheus text format), `/healthz` and `/readyz`. The \
         provisioner's metrics keep the Go provisioner's names, types and help texts, and every \
         series listed with its label values exists from the start at 0. `site` is the \
         configuration's `site` on every series of the provisioner.\n\n\
         See [Metrics and health](../operations/metrics.md) for what to watch, and \
         [Alerts](../operations/alerts.md) for the shipped alerts.\n",
    );
    p.push_str("\n## The provisioner (`run`)\n\n");
    metrics_table(&mut p, &own_provisioner, &["site"]);
    p.push_str("\n## The operator (`operator`)\n\n");
    metrics_table(&mut p, &own_operator, &[]);
    p.push_str("\n## Both: the process\n\nThe standard `process_*` metrics, without labels.\n\n");
    metrics_table(&mut p, &shared, &[]);
    p
}

#[test]
fn the_metrics_reference_is_current() {
    check_page("metrics.md", &metrics_page());
}

// ---------------------------------------------------------------------------
// The Provisioner CRD

fn crd_yaml() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .arg("crd")
        .output()
        .expect("running choria-provisioner crd");
    assert!(
        out.status.success(),
        "choria-provisioner crd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_provisioner_crd_reference_is_current() {
    check_page("provisioner-crd.md", &crd::page(&crd_yaml()));
}

// ---------------------------------------------------------------------------
// Example files

/// Every file under `docs/src/examples/`, loaded as what it is.
#[test]
fn every_example_file_loads_with_the_projects_parsers() {
    let dir = repo().join("docs/src/examples");
    let mut files = Vec::new();
    walk(&dir, &mut files);
    assert!(
        !files.is_empty(),
        "no example files under {}",
        dir.display()
    );
    for path in &files {
        let rel = path.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yaml") {
            check_yaml_file(&rel, &text);
        } else if name == "Dockerfile" {
            // An image made from ours: scripts/check-manifests.sh parses it
            // with BuildKit's parser and holds it to scripts/image-contract.env.
            assert!(text.contains("FROM ${BASE}"), "{rel}: not FROM ${{BASE}}");
        } else if name.ends_with(".cfg") {
            let cfg = choria_config::ChoriaClientConfig::load(path)
                .unwrap_or_else(|e| panic!("{rel}: {e}"));
            no_warnings(&rel, &cfg.warnings);
        } else {
            panic!("{rel}: tests/it/book.rs does not know how to load this kind of file; teach it");
        }
    }
}

/// A YAML example: Kubernetes objects (a `Provisioner` is checked by the
/// operator's own validation, `operator::validate`'s example test) or a
/// `provisioner.yaml`, which must parse without a warning.
fn check_yaml_file(rel: &str, text: &str) {
    let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(text)
        .map(|d| {
            <serde_json::Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{rel}: {e}"))
        })
        .collect();
    if docs.iter().any(|d| d.get("apiVersion").is_some()) {
        for d in &docs {
            assert!(
                d.get("apiVersion").is_some() && d.get("kind").is_some(),
                "{rel}: a document without apiVersion and kind among Kubernetes objects"
            );
        }
        return;
    }
    check_provisioner_yaml(rel, text);
}

fn check_provisioner_yaml(rel: &str, text: &str) {
    let cfg = ProvisionerConfig::parse(text, rel).unwrap_or_else(|e| panic!("{e}\n{text}"));
    no_warnings(rel, &cfg.warnings);
}

/// An example is written to load cleanly: a warning is a mistake in it.
fn no_warnings(rel: &str, warnings: &[choria_config::ConfigWarning]) {
    let text: Vec<String> = warnings.iter().map(|w| w.to_string()).collect();
    assert!(text.is_empty(), "{rel}: warnings: {text:?}");
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
    out.sort();
}

/// The quick start without Kubernetes, as a reader follows it: its files in
/// one directory with the example helper and a verifying key, checked by
/// `run --check` as the page says.
#[test]
fn the_local_quick_start_passes_run_check() {
    let work = tempfile::tempdir().unwrap();
    let local = repo().join("docs/src/examples/local");
    for f in ["provisioner.yaml", "choria.cfg"] {
        std::fs::copy(local.join(f), work.path().join(f)).unwrap();
    }
    std::fs::copy(
        repo().join("examples/helper.sh"),
        work.path().join("helper.sh"),
    )
    .unwrap();
    // What `openssl genrsa` + `openssl rsa -pubout` make.
    let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
    let public = rsa::pkcs8::EncodePublicKey::to_public_key_pem(
        &rsa::RsaPublicKey::from(&key),
        rsa::pkcs8::LineEnding::LF,
    )
    .unwrap();
    std::fs::write(work.path().join("signer.pub"), public).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args([
            "run",
            "--check",
            "--config",
            "provisioner.yaml",
            "--choria-config",
            "choria.cfg",
        ])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "run --check refused the quick start's files:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every YAML block written into a page (not included from a file) is a
/// `provisioner.yaml` fragment that parses without a warning; Kubernetes
/// objects and whole files are included from checked files instead.
#[test]
fn yaml_written_into_the_pages_parses() {
    let mut pages = Vec::new();
    walk(&repo().join("docs/src"), &mut pages);
    let mut checked = 0;
    for page in pages
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        let rel = page.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(page).unwrap();
        for (line, block) in yaml_blocks(&text) {
            let at = format!("{rel}:{line}");
            if block.trim_start().starts_with("{{#include") {
                let target = block
                    .trim()
                    .trim_start_matches("{{#include")
                    .trim_end_matches("}}")
                    .trim();
                let target = target.split(':').next().unwrap();
                let resolved = page.parent().unwrap().join(target);
                let resolved = resolved
                    .canonicalize()
                    .unwrap_or_else(|e| panic!("{at}: includes {target}: {e}"));
                let checked_dirs = ["docs/src/examples", "deploy", "examples", "charts"];
                assert!(
                    checked_dirs
                        .iter()
                        .any(|d| resolved.starts_with(repo().join(d).canonicalize().unwrap())),
                    "{at}: includes {target}, which no test loads: put it under docs/src/examples"
                );
                continue;
            }
            assert!(
                !block.contains("apiVersion:"),
                "{at}: a Kubernetes object written into the page: make it a file under \
                 docs/src/examples (checked by the operator's own validation) and include it"
            );
            let mut text = block.clone();
            // A fragment shows some keys; what every file needs is added.
            if !text.contains("helper:") && !text.contains("configuration_template:") {
                text.push_str("\nhelper: ./helper.sh\n");
            }
            if !text.contains("token") {
                text.push_str("\ntoken: s3cret\n");
            }
            check_provisioner_yaml(&at, &text);
            checked += 1;
        }
    }
    assert!(checked > 0, "no YAML block found in the book");
}

/// The ```yaml blocks of a markdown page, with the line they start on.
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut current {
            None if trimmed.starts_with("```yaml") => current = Some((i + 1, String::new())),
            Some(_) if trimmed.starts_with("```") => out.push(current.take().unwrap()),
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}
