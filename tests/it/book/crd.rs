//! The `Provisioner` reference page, from the CRD `choria-provisioner crd`
//! prints: every field of its OpenAPI schema with its type, constraints,
//! default and description.

use super::render::{cell, code, generated_notice, one_line};
use serde_json::Value;
use std::fmt::Write as _;

/// A field with more nested fields than this is an embedded Kubernetes type
/// (affinity, tolerations, …): one row pointing at `kubectl explain`
/// instead of hundreds.
const MAX_NESTED_FIELDS: usize = 25;
/// Our own types that embed Kubernetes ones: their fields are listed (the
/// embedded types collapsed as above), however many fields those hold.
const OWN_TYPES: [&str; 2] = ["spec.pod", "spec.pod.volumes"];

pub fn page(crd_yaml: &str) -> String {
    let crd: Value = serde_norway::from_str(crd_yaml).expect("the CRD is YAML");
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = names["kind"].as_str().expect("spec.names.kind");
    let group = spec["group"].as_str().expect("spec.group");
    let plural = names["plural"].as_str().unwrap_or_default();
    let lower = kind.to_lowercase();

    let mut p = String::new();
    writeln!(p, "# The `{kind}` resource\n").unwrap();
    p.push_str(&generated_notice(
        "the CustomResourceDefinition `choria-provisioner crd` prints (the same as \
         `crds/provisioner.yaml`), its OpenAPI schema and descriptions",
    ));
    let short: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(code).collect())
        .unwrap_or_default();
    writeln!(
        p,
        "| | |\n|---|---|\n| Group | {} |\n| Kind | {} |\n| Plural | {} |\n| Short names | {} |\n| Scope | {} |\n",
        code(group),
        code(kind),
        code(plural),
        if short.is_empty() { "—".into() } else { short.join(", ") },
        spec["scope"].as_str().unwrap_or_default()
    )
    .unwrap();
    writeln!(
        p,
        "`kubectl explain {lower}.spec` shows the same descriptions on a cluster where the CRD is installed.\n"
    )
    .unwrap();

    for version in spec["versions"].as_array().expect("spec.versions") {
        let name = version["name"].as_str().unwrap_or_default();
        let mut flags = Vec::new();
        if version["served"].as_bool() == Some(true) {
            flags.push("served");
        }
        if version["storage"].as_bool() == Some(true) {
            flags.push("stored");
        }
        writeln!(p, "## `{group}/{name}`\n").unwrap();
        if !flags.is_empty() {
            writeln!(p, "This version is {}.\n", flags.join(" and ")).unwrap();
        }
        if let Some(columns) = version["additionalPrinterColumns"].as_array() {
            writeln!(
                p,
                "`kubectl get {}` shows:\n\n| Column | From | Description |\n|---|---|---|",
                short
                    .first()
                    .map_or(plural, |_| names["shortNames"][0].as_str().unwrap())
            )
            .unwrap();
            for c in columns {
                writeln!(
                    p,
                    "| {} | {} | {} |",
                    c["name"].as_str().unwrap_or_default(),
                    code(c["jsonPath"].as_str().unwrap_or_default()),
                    c["description"].as_str().map_or("—".to_string(), cell)
                )
                .unwrap();
            }
            p.push('\n');
        }
        if let Some(sub) = version["subresources"].as_object() {
            let subs: Vec<String> = sub.keys().map(|k| code(k)).collect();
            writeln!(p, "Subresources: {}.\n", subs.join(", ")).unwrap();
        }
        let schema = &version["schema"]["openAPIV3Schema"];
        if let Some(d) = schema["description"].as_str() {
            writeln!(p, "{}\n", one_line(d)).unwrap();
        }
        for top in ["spec", "status"] {
            let node = &schema["properties"][top];
            if node.is_null() {
                continue;
            }
            writeln!(p, "### `{top}`\n").unwrap();
            if let Some(d) = node["description"].as_str() {
                writeln!(p, "{}\n", one_line(d)).unwrap();
            }
            let refusals = refusals(node);
            if !refusals.is_empty() {
                p.push_str("The API server refuses a `Provisioner` that breaks these rules:\n\n");
                for r in refusals {
                    writeln!(p, "- {r}").unwrap();
                }
                p.push('\n');
            }
            p.push_str("| Field | Type | Default | Description |\n|---|---|---|---|\n");
            fields(&mut p, &lower, top, node);
        }
    }
    p
}

/// The rows of `node`'s properties, depth first, under `path`.
fn fields(p: &mut String, kind: &str, path: &str, node: &Value) {
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = node["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, child) in props {
        let field = format!("{path}.{name}");
        let nested = count_fields(child);
        let collapsed = nested > MAX_NESTED_FIELDS && !OWN_TYPES.contains(&field.as_str());
        let mut description = child["description"]
            .as_str()
            .map(one_line)
            .unwrap_or_default();
        if required.contains(&name.as_str()) {
            description.insert_str(0, "**Required.** ");
        }
        let constraints = constraints(child);
        if !constraints.is_empty() {
            write!(description, " ({})", constraints.join("; ")).unwrap();
        }
        // A list's rules, then those of each of its items.
        let mut refusals = refusals(child);
        refusals.extend(self::refusals(&child["items"]));
        if !refusals.is_empty() {
            write!(description, " Refused otherwise: {}.", refusals.join("; ")).unwrap();
        }
        if collapsed {
            let explain = field.replace("[]", "").replace("{}", "");
            write!(
                description,
                " A Kubernetes type with {nested} nested fields: `kubectl explain {kind}.{explain}` lists them."
            )
            .unwrap();
        }
        let default = match &child["default"] {
            Value::Null => "—".to_string(),
            v => code(&serde_json::to_string(v).unwrap()),
        };
        writeln!(
            p,
            "| <a id=\"{field}\"></a>`{field}` | {} | {} | {} |",
            type_of(child),
            cell(&default),
            cell(description.trim())
        )
        .unwrap();
        if collapsed {
            continue;
        }
        fields(p, kind, &field, child);
        if child["items"]["properties"].is_object() {
            fields(p, kind, &format!("{field}[]"), &child["items"]);
        }
        if child["additionalProperties"]["properties"].is_object() {
            fields(
                p,
                kind,
                &format!("{field}{{}}"),
                &child["additionalProperties"],
            );
        }
    }
}

/// The messages of a node's CEL rules (`x-kubernetes-validations`): what
/// the API server answers when a rule does not hold.
fn refusals(node: &Value) -> Vec<String> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .map(|r| match r["message"].as_str() {
                    Some(m) => format!("“{}”", one_line(m)),
                    None => code(r["rule"].as_str().unwrap_or_default()),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn count_fields(node: &Value) -> usize {
    let mut n = 0;
    if let Some(props) = node["properties"].as_object() {
        for child in props.values() {
            n += 1 + count_fields(child);
        }
    }
    for key in ["items", "additionalProperties"] {
        if node[key].is_object() {
            n += count_fields(&node[key]);
        }
    }
    n
}

fn type_of(node: &Value) -> String {
    if node["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        return "integer or string".into();
    }
    if node["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
        && node["properties"].is_null()
    {
        return "any".into();
    }
    let base = node["type"].as_str().unwrap_or("any");
    match base {
        "array" => format!("list of {}", plural(&type_of(&node["items"]))),
        "object" if node["additionalProperties"].is_object() => {
            format!("map of {}", plural(&type_of(&node["additionalProperties"])))
        }
        t => match node["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
    }
}

fn plural(t: &str) -> String {
    match t {
        "object" => "objects".into(),
        "string" => "strings".into(),
        "integer" => "integers".into(),
        "boolean" => "booleans".into(),
        t => t.to_string(),
    }
}

fn constraints(node: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = node["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| match v {
                Value::String(s) => code(s),
                Value::Null => "`null`".into(),
                v => code(&v.to_string()),
            })
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    for (key, words) in [
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("minLength", "length at least"),
        ("maxLength", "length at most"),
        ("minItems", "items at least"),
        ("maxItems", "items at most"),
    ] {
        if let Some(v) = node.get(key).filter(|v| !v.is_null()) {
            // `minimum: 1.0` reads as 1.
            let v = match v.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
                _ => v.to_string(),
            };
            out.push(format!("{words} {v}"));
        }
    }
    if let Some(pattern) = node["pattern"].as_str() {
        out.push(format!("matches {}", code(pattern)));
    }
    out
}
